"""Turn pydantic's JSON Schema into a Kubernetes structural schema (OpenAPI v3 subset).

Kubernetes requires every node to carry its own `type`, forbids `$ref`, `$defs`, `const`
and `additionalProperties: false`, and only allows `anyOf` for value validation. Pydantic
emits all of those, so this module inlines references, drops the `null` branch of optional
fields (absent means unset), and fails loudly on any construct it does not know how to map,
so that a model change can never silently produce a CRD the apiserver rejects.
"""

from typing import Any

_PASSTHROUGH_KEYS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "enum",
        "default",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "maxProperties",
        "format",
    }
)
_DROPPED_KEYS = frozenset({"title"})


class UnsupportedSchemaError(ValueError):
    """A pydantic schema construct with no structural-schema equivalent."""


def structural_schema(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """The structural form of `schema`, resolving `$ref`s against `definitions`."""
    node = _flatten(schema, definitions)
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key.startswith("x-kubernetes-"):
            result[key] = value
        elif key == "properties":
            result[key] = {
                name: structural_schema(child, definitions) for name, child in value.items()
            }
        elif key == "items":
            result[key] = structural_schema(value, definitions)
        elif key == "additionalProperties":
            # A schema here is a map's values (a dict field); `false` (a closed model) is not
            # allowed in a structural schema: unknown fields are pruned by the apiserver (and
            # rejected by kubectl's strict field validation).
            if isinstance(value, dict):
                result[key] = structural_schema(value, definitions)
            elif value is not False:
                raise UnsupportedSchemaError(f"additionalProperties={value!r} is not mapped")
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020-12 gives the bound; OpenAPI v3.0 a flag on minimum/maximum.
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            result[bound] = value
            result[key] = True
        elif key == "default" and value is None:
            continue  # an optional field's absence, not a value
        elif key in _PASSTHROUGH_KEYS:
            result[key] = value
        else:
            raise UnsupportedSchemaError(f"schema key {key!r} has no structural equivalent")
    if "type" not in result:
        raise UnsupportedSchemaError(f"schema node without a type: {node!r}")
    return result


def _flatten(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """Inline a top-level $ref or optional anyOf; the node's own keys win over the target's."""
    if "$ref" in node:
        target = definitions[node["$ref"].removeprefix("#/$defs/")]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _flatten({**target, **siblings}, definitions)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        if len(branches) != 1:
            raise UnsupportedSchemaError(f"anyOf with several non-null branches: {node!r}")
        siblings = {k: v for k, v in node.items() if k != "anyOf"}
        return _flatten({**_flatten(branches[0], definitions), **siblings}, definitions)
    return node
