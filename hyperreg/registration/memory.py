"""Handing freed memory back to the operating system between the large steps of a registration.

At native 256³ a registration allocates and frees many arrays of 8-48 MiB (network-grid
tensors during refinement, slabs of sample positions while the chain is sampled). glibc's
allocator serves most of them from its heap, and freed heap memory stays in the process (its
resident size) while anything allocated later sits above it: measured on the default register
of a 256³ pair, about 500 MiB of the process's resident memory after refinement was freed memory
not yet returned. :func:`release_freed_memory` returns it (``malloc_trim``) before the next step
allocates its own arrays, so the peak is what the step needs, not what earlier steps left.
No effect, and no error, where the C library has no ``malloc_trim`` (macOS, Windows, musl).
Must not import training, apps or cli.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

__all__ = ["release_freed_memory"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` of this process, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the operating system (glibc ``malloc_trim(0)``).

    Frees nothing that is in use, changes no value; the cost is a walk over the heap's free
    chunks (milliseconds). Call it after a step that freed large temporaries and before the
    next one allocates.

    Returns:
        True when the C library has ``malloc_trim`` (glibc, Linux) and it ran; False elsewhere
        (nothing done).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
