"""The `LLMDeployment` resource and its conversion to and from Kubernetes manifests."""

from typing import Any, Literal

from pydantic import Field, ValidationError

from llmfleet.api.base import CEL_RULE_ERROR_TYPE, ApiModel
from llmfleet.api.spec import LLMDeploymentSpec
from llmfleet.api.status import LLMDeploymentStatus

GROUP = "llmfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMDeployment"
PLURAL = "llmdeployments"
SINGULAR = "llmdeployment"
SHORT_NAMES = ("llmdep",)
CRD_NAME = f"{PLURAL}.{GROUP}"


class InvalidSpecError(ValueError):
    """A manifest that does not validate; `problems` pairs each field path with its message."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__(
            "invalid LLMDeployment:\n" + "\n".join(f"  {path}: {msg}" for path, msg in problems)
        )


def _field_path(error: dict[str, Any]) -> str:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    if error["type"] == CEL_RULE_ERROR_TYPE and error["ctx"]["field_path"]:
        path += error["ctx"]["field_path"]
    return path or "<root>"


def _problem_message(error: dict[str, Any]) -> str:
    # Our own messages already say what to do; drop pydantic's "Value error, " prefix.
    return error["msg"].removeprefix("Value error, ")


class LLMDeployment(ApiModel):
    """An LLM served by Triton + TensorRT-LLM, planned from SLO targets."""

    api_version: Literal["llmfleet.io/v1alpha1"] = Field(
        default=API_VERSION, description="llmfleet.io/v1alpha1"
    )
    kind: Literal["LLMDeployment"] = Field(default=KIND, description="LLMDeployment")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Standard Kubernetes object metadata."
    )
    spec: LLMDeploymentSpec = Field(description="Desired state.")
    status: LLMDeploymentStatus | None = Field(
        default=None, description="Observed state, written by the operator."
    )

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> "LLMDeployment":
        """Validate a manifest (e.g. a Kopf body or a parsed YAML document).

        Raises InvalidSpecError naming every offending field path (e.g. spec.slo.ttftP99Ms).
        """
        try:
            return cls.model_validate(manifest)
        except ValidationError as error:
            raise InvalidSpecError(
                [(_field_path(e), _problem_message(e)) for e in error.errors()]
            ) from None

    def to_manifest(self, *, include_defaults: bool = True) -> dict[str, Any]:
        """The manifest as Kubernetes stores it (camelCase, no nulls).

        include_defaults=False keeps only the fields that were set, for a faithful round trip
        of what the user wrote.
        """
        return self.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude_unset=not include_defaults
        )
