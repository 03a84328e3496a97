"""Shared building blocks: the API base model, CEL rules, reusable field types.

A `CelRule` is declared once and used twice: its `rule`/`message` go into the CRD as
`x-kubernetes-validations` (enforced by the apiserver at admission), and its `holds`
predicate enforces the same constraint when Python code builds a model, with the same
message, so `llmfleet plan -f` and admission reject a spec for the same reason.
"""

import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, NamedTuple, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

CEL_RULE_ERROR_TYPE = "cel_rule"


class CelRule(NamedTuple):
    """One Kubernetes CEL validation rule and its Python twin."""

    rule: str
    message: str
    # Python twin of `rule`, given the model instance. None only where the input the rule
    # inspects never reaches the model (a before-validator rejects it with the same message).
    holds: Callable[[Any], bool] | None
    # Relative JSON path (e.g. ".minReplicas") the apiserver reports the error at.
    field_path: str | None = None

    def as_schema(self) -> dict[str, str]:
        entry = {"rule": self.rule, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry


def _add_schema_extras(schema: dict[str, Any], cls: type["ApiModel"]) -> None:
    rules = [rule.as_schema() for rule in cls.cel_rules]
    if rules:
        schema["x-kubernetes-validations"] = rules
    schema.setdefault("properties", {}).update(cls.schema_only_properties)


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, snake_case in Python, closed schema."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        json_schema_extra=_add_schema_extras,
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = ()
    # Properties that exist in the CRD schema only, so that CEL can see (and reject) them.
    schema_only_properties: ClassVar[dict[str, dict[str, Any]]] = {}

    @model_validator(mode="after")
    def _check_cel_rules(self):
        for cel_rule in self.cel_rules:
            if cel_rule.holds is not None and not cel_rule.holds(self):
                # field_path travels in the error context so that errors name the same
                # field the apiserver does (see resource.InvalidSpecError).
                raise PydanticCustomError(
                    CEL_RULE_ERROR_TYPE, cel_rule.message, {"field_path": cel_rule.field_path}
                )
        return self


def defaulted_model_field(model_cls: type[ApiModel], description: str) -> Any:
    """An optional object field that defaults to the model's defaults, in Python and in the CRD.

    The CRD default is spelled out in full rather than `{}`: the apiserver checks a default
    against the CEL rules as written, without filling in nested defaults first.
    """
    return Field(
        default_factory=model_cls,
        description=description,
        json_schema_extra={"default": model_cls().model_dump(mode="json", exclude_none=True)},
    )


T = TypeVar("T")


def _reject_duplicates(values: list[T]) -> list[T]:
    if len(set(values)) != len(values):
        raise ValueError("list each value once (duplicates are not allowed)")
    return values


def set_of(item_type: Any, max_items: int) -> Any:
    """A non-empty list of unique scalars, stored by Kubernetes as a set."""
    return Annotated[
        list[item_type],
        AfterValidator(_reject_duplicates),
        Field(
            min_length=1,
            max_length=max_items,
            json_schema_extra={"x-kubernetes-list-type": "set"},
        ),
    ]


def _to_utc_seconds(value: datetime) -> datetime:
    # metav1.Time has second precision and is always UTC on the wire.
    if value.tzinfo is None:
        raise ValueError("timestamps must carry a timezone (use UTC)")
    return value.astimezone(timezone.utc).replace(microsecond=0)


KubeTime = Annotated[
    datetime,
    AfterValidator(_to_utc_seconds),
    PlainSerializer(
        lambda value: value.strftime("%Y-%m-%dT%H:%M:%SZ"), return_type=str, when_used="json"
    ),
]
"""An RFC 3339 UTC timestamp with second precision, like metav1.Time."""


# Kubernetes object-name and URI shapes used by several fields.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
URI_PATTERN = r"^[a-z][a-z0-9+.-]*://\S+$"
# A URI whose authority holds "user[:password]@" carries a credential inline.
URI_WITH_CREDENTIALS_PATTERN = r"^[a-z][a-z0-9+.-]*://[^/@]*@"
_URI_WITH_CREDENTIALS = re.compile(URI_WITH_CREDENTIALS_PATTERN)
URI_CREDENTIALS_MESSAGE = (
    "must not embed credentials (user:password@); store them in a Secret and reference it "
    "with spec.model.secretRef"
)


def no_uri_credentials_rule(camel_field: str, python_field: str, path: str) -> CelRule:
    """Reject an optional URI field that carries "user:password@"."""
    return CelRule(
        rule=f"!has(self.{camel_field}) || "
        f"!self.{camel_field}.matches('{URI_WITH_CREDENTIALS_PATTERN}')",
        message=f"{path} {URI_CREDENTIALS_MESSAGE}",
        holds=lambda model: getattr(model, python_field) is None
        or not _URI_WITH_CREDENTIALS.match(getattr(model, python_field)),
        field_path=f".{camel_field}",
    )


MAX_URI_LENGTH = 2048
