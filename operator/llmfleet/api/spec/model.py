"""`spec.model`: which model to serve, where its weights come from and the credential to fetch them."""

import re
from typing import Any

from pydantic import Field, model_validator

from llmfleet.api.base import (
    DNS_SUBDOMAIN_PATTERN,
    MAX_URI_LENGTH,
    SECRET_KEY_PATTERN,
    URI_PATTERN,
    URI_WITH_CREDENTIALS_PATTERN,
    ApiModel,
    CelRule,
    no_uri_credentials_rule,
)
from llmfleet.api.enums import CatalogModel
from llmfleet.api.spec.architecture import ModelArchitecture


HUGGING_FACE_SCHEME = "hf://"
VOLUME_SCHEME = "pvc://"
OBJECT_STORE_SCHEME = "s3://"
# Where weights can come from: a Hugging Face hub repo, a directory on a PersistentVolumeClaim
# of the deployment's namespace, or a prefix in an S3 bucket (AWS or any S3-compatible store;
# bucket names follow S3's rules: 3-63 lower-case letters, digits, dots and hyphens).
HUB_REPO_PATTERN = r"[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+"
VOLUME_URI_PATTERN = r"pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+"
OBJECT_STORE_URI_PATTERN = r"s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/.*)?"
WEIGHTS_SOURCE_PATTERN = f"^(hf://{HUB_REPO_PATTERN}|{VOLUME_URI_PATTERN}|{OBJECT_STORE_URI_PATTERN})$"
WEIGHTS_SOURCES = ("hf://<org>/<repo> (a Hugging Face hub repo), pvc://<claim>/<path> (a checkpoint "
                   "directory on a PersistentVolumeClaim in the namespace) or s3://<bucket>/<prefix> (a "
                   "checkpoint directory in an S3-compatible object store)")
WEIGHTS_SOURCE_MESSAGE = f"spec.model.source must be {WEIGHTS_SOURCES}"
SOURCE_REQUIRED_MESSAGE = f"spec.model.source is required to serve: {WEIGHTS_SOURCES}"


def hub_repo_id(uri: str | None) -> str | None:
    """The Hugging Face hub repo id of an hf://<org>/<repo> URI; None for any other URI or none."""
    return uri.removeprefix(HUGGING_FACE_SCHEME) if uri and uri.startswith(HUGGING_FACE_SCHEME) else None


HUB_DATASET_PREFIX = f"{HUGGING_FACE_SCHEME}datasets/"


def hub_dataset_id(uri: str | None) -> str | None:
    """The Hugging Face hub dataset repo id of an hf://datasets/<org>/<name> URI; None otherwise."""
    return uri.removeprefix(HUB_DATASET_PREFIX) if uri and uri.startswith(HUB_DATASET_PREFIX) else None


def volume_source(uri: str | None) -> tuple[str, str] | None:
    """(claim, path in it) of a pvc://<claim>/<path> URI; None for any other URI or none."""
    if not uri or not uri.startswith(VOLUME_SCHEME):
        return None
    claim, _, path = uri.removeprefix(VOLUME_SCHEME).partition("/")
    return claim, path.strip("/")


HTTP_ENDPOINT_PATTERN = r"^https?://[^/]+(/.*)?$"


def in_object_store(uri: str | None) -> bool:
    """Whether the weights are under an s3://<bucket>/<prefix> URI."""
    return bool(uri) and uri.startswith(OBJECT_STORE_SCHEME)


# Keys people reach for when they paste a hub token into a spec. They are declared in the
# CRD only so that admission rejects them with a pointer to secretRef: pruning alone would
# drop them silently.
INLINE_CREDENTIAL_FIELDS = ("apiKey", "hfToken", "password", "token")
INLINE_CREDENTIAL_MESSAGE = (
    "inline credentials are not allowed in spec.model; store the token in a Secret and "
    "reference it with spec.model.secretRef {name, key}"
)


class SecretKeyReference(ApiModel):
    """A key in a Secret in the LLMDeployment's namespace."""

    name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the Secret, in the same namespace as the LLMDeployment.",
    )
    key: str = Field(
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key within the Secret whose value is the token.",
    )


class ObjectStoreOptions(ApiModel):
    """How to reach the object store of an s3:// source (AWS S3 needs none of this but a region)."""

    endpoint_url: str | None = Field(
        default=None,
        max_length=MAX_URI_LENGTH,
        pattern=URI_PATTERN,
        description="The S3 API endpoint of an S3-compatible store (MinIO, Ceph, a cloud's S3 "
        "gateway), e.g. http://minio.storage.svc:9000. Unset: AWS S3.",
    )
    region: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[a-z0-9][-a-z0-9]*$",
        description="The bucket's region, e.g. eu-west-1. Unset: the download client's default "
        "(the credentials file's profile, then us-east-1).",
    )

    cel_rules = (
        no_uri_credentials_rule("endpointUrl", "endpoint_url", "spec.model.objectStore.endpointUrl"),
        CelRule(
            rule=f"!has(self.endpointUrl) || self.endpointUrl.matches('{URI_WITH_CREDENTIALS_PATTERN}') || "
            f"self.endpointUrl.matches('{HTTP_ENDPOINT_PATTERN}')",
            message="spec.model.objectStore.endpointUrl must be an http:// or https:// URL of the S3 API, "
            "e.g. http://minio.storage.svc:9000",
            holds=lambda m: m.endpoint_url is None or re.match(URI_WITH_CREDENTIALS_PATTERN, m.endpoint_url)
            is not None or re.match(HTTP_ENDPOINT_PATTERN, m.endpoint_url) is not None,
            field_path=".endpointUrl",
        ),
    )


class ModelSpec(ApiModel):
    """Which model to serve (a catalog name or an inline architecture) and where its weights are."""

    name: CatalogModel | None = Field(
        default=None,
        description="Catalog model name. Set exactly one of name or architecture.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="Inline architecture of a model that is not in the catalog. Set exactly "
        "one of name or architecture.",
    )
    source: str | None = Field(
        default=None,
        max_length=MAX_URI_LENGTH,
        pattern=URI_PATTERN,
        description="Where the weights come from: hf://<org>/<repo> (the Hugging Face hub, e.g. "
        "hf://meta-llama/Llama-3.1-8B-Instruct) or pvc://<claim>/<path> (a Hugging Face "
        "checkpoint directory on a PersistentVolumeClaim in the namespace). Required to serve. "
        "Never embed credentials: use secretRef.",
    )
    tokenizer: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Tokenizer to load (hub id or URI). Defaults to the one shipped with the "
        "weights.",
    )
    secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="Secret key holding the credential used to download the weights and "
        "tokenizer, mounted as a file and never inline: for hf:// the hub token; for s3:// an "
        "AWS shared credentials file ([default] with aws_access_key_id and "
        "aws_secret_access_key). Unset with s3://, the client's own chain applies (workload "
        "identity, instance role).",
    )
    object_store: ObjectStoreOptions | None = Field(
        default=None,
        description="Endpoint and region of an s3:// source; only with an s3:// source.",
    )

    schema_only_properties = {
        key: {
            "type": "string",
            "maxLength": 4096,
            "description": "Not allowed: declared only so that admission can reject an inline "
            "credential. Use secretRef.",
        }
        for key in INLINE_CREDENTIAL_FIELDS
    }
    cel_rules = (
        CelRule(
            rule="has(self.name) != has(self.architecture)",
            message="spec.model: set exactly one of name (a catalog model such as "
            "llama-3.1-8b) or architecture (an inline architecture)",
            holds=lambda m: (m.name is None) != (m.architecture is None),
        ),
        CelRule(
            rule=" && ".join(f"!has(self.{key})" for key in INLINE_CREDENTIAL_FIELDS),
            message=INLINE_CREDENTIAL_MESSAGE,
            holds=None,  # _reject_inline_credentials: the model has no such fields
        ),
        no_uri_credentials_rule("source", "source", "spec.model.source"),
        # A URI with credentials gets only the rule above, which says what to do instead.
        CelRule(
            rule=f"!has(self.source) || self.source.matches('{URI_WITH_CREDENTIALS_PATTERN}') || "
            f"self.source.matches('{WEIGHTS_SOURCE_PATTERN}')",
            message=WEIGHTS_SOURCE_MESSAGE,
            holds=lambda m: m.source is None or re.match(URI_WITH_CREDENTIALS_PATTERN, m.source) is not None
            or re.match(WEIGHTS_SOURCE_PATTERN, m.source) is not None,
            field_path=".source",
        ),
        CelRule(
            rule=f"!has(self.objectStore) || has(self.source) && self.source.startsWith('{OBJECT_STORE_SCHEME}')",
            message=f"spec.model.objectStore applies only to an {OBJECT_STORE_SCHEME}<bucket>/<prefix> source; "
            "remove it or change spec.model.source",
            holds=lambda m: m.object_store is None or in_object_store(m.source),
            field_path=".objectStore",
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _reject_inline_credentials(cls, data: Any) -> Any:
        if isinstance(data, dict):
            inline = sorted(set(data) & set(INLINE_CREDENTIAL_FIELDS))
            if inline:
                raise ValueError(f"{INLINE_CREDENTIAL_MESSAGE} (found: {', '.join(inline)})")
        return data
