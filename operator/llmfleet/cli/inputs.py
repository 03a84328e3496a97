"""What the commands check their input with: argument types, and BadInput for input that
parses but cannot be used. Plug-ins' commands use them too (through llmfleet.cli)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


class BadInput(Exception):
    """Input the command cannot use (unreadable file, invalid manifest, unknown name): exit 2."""


def _positive(text: str, kind: type = int) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {'at least 1' if kind is int else 'above 0'}, got {text}")
    return value


def positive_int(text: str) -> int:
    """An argument type for whole numbers from 1 (plugins' commands use it too)."""
    return _positive(text, int)


def positive_float(text: str) -> float:
    return _positive(text, float)


def read_mapping(path: str, label: str, *, json_only: bool = False) -> dict:
    """One YAML mapping, or with `json_only` one JSON object (PyYAML reads JSON's `1e-05` as a
    string), from a file or from stdin when path is `-`; BadInput names `label` (the argument,
    e.g. `-f FILE`) when it cannot be read or holds no mapping."""
    import json

    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise BadInput(f"{label}: cannot read it: {error.strerror}") from None
    try:
        document = json.loads(text) if json_only else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise BadInput(f"{label}: not valid {'JSON' if json_only else 'YAML'}: {error}") from None
    if not isinstance(document, dict):
        kind = "JSON object" if json_only else "YAML mapping"
        raise BadInput(f"{label}: expected one {kind}, got {type(document).__name__}")
    return document
