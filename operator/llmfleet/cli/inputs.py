"""What the commands check their input with: argument types, and BadInput for input that
parses but cannot be used. Plug-ins' commands use them too (through llmfleet.cli)."""

from __future__ import annotations

import argparse
import math


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
