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


def read_mapping(path: str, label: str) -> dict:
    """One YAML mapping (JSON is YAML too) from a file, or from stdin when path is `-`; BadInput
    names `label` (the argument, e.g. `-f FILE`) when it cannot be read or is no mapping."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise BadInput(f"{label}: cannot read it: {error.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BadInput(f"{label}: not valid YAML or JSON: {error}") from None
    if not isinstance(document, dict):
        raise BadInput(f"{label}: expected one YAML mapping (a JSON object), got {type(document).__name__}")
    return document
