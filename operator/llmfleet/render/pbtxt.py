"""A small writer of protobuf text format, enough for Triton's config.pbtxt.

A message is a dict; a list of dicts is a repeated message (one block per item); a list of
scalars is a repeated scalar; `Symbol` is an enum value (unquoted); str is quoted.
"""

from __future__ import annotations

import json
from typing import Any

INDENT = "  "


class Symbol(str):
    """An enum value such as TYPE_INT32 or KIND_CPU, written without quotes."""


def _scalar(value: Any) -> str:
    if isinstance(value, Symbol):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON string escaping is valid text-format escaping for these characters.
        return json.dumps(value)
    raise TypeError(f"cannot write {value!r} as a protobuf scalar")


def _lines(message: dict[str, Any], depth: int) -> list[str]:
    pad = INDENT * depth
    lines = []
    for name, value in message.items():
        items = value if isinstance(value, list) else [value]
        if items and all(isinstance(item, dict) for item in items):
            for item in items:
                lines.append(f"{pad}{name} {{")
                lines.extend(_lines(item, depth + 1))
                lines.append(f"{pad}}}")
        elif isinstance(value, list):
            lines.append(f"{pad}{name}: [ {', '.join(_scalar(item) for item in value)} ]")
        else:
            lines.append(f"{pad}{name}: {_scalar(value)}")
    return lines


def to_pbtxt(message: dict[str, Any]) -> str:
    return "\n".join(_lines(message, 0)) + "\n"


def string_parameters(values: dict[str, str]) -> list[dict[str, Any]]:
    """Triton's `parameters` map, whose values are all strings."""
    return [{"key": key, "value": {"string_value": value}} for key, value in values.items()]
