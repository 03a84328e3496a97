"""Giving freed heap memory back to the system.

What a thread frees stays in its glibc arena: after a burst (a thousand deployments created at
once) the operator's RSS stayed near the burst's peak although the objects were gone
(docs/benchmarks/scale.md). malloc_trim(0) returns the free pages of every arena. Where the
chart preloads jemalloc, glibc's arenas hold next to nothing and this finds little to return;
jemalloc's background thread returns its own free pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    library = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(library).malloc_trim if library else None
    except (OSError, AttributeError):  # a C library without it (musl, macOS): nothing to give back
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Return the pages malloc holds free to the system (milliseconds; ctypes drops the GIL
    meanwhile). False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
