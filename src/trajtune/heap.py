"""Giving the C heap's free memory back to the operating system between passes.

On CPU, tensors live in the C heap. glibc keeps blocks under its (adaptive, up to 32 MiB) mmap
threshold in heap arenas, and memory freed there stays resident. With the optimizer step inside the
backward pass (``step_in_backward``) the gradients are freed one by one while recomputed
activations come and go, and on SmolLM2-135M the heap grew by 0.45 GB over one backward pass that
held almost no gradient; ``malloc_trim(0)`` returns those free pages (peak 2.83 → 2.43 GB,
docs/speed.md). The cost is the call (tens of milliseconds on a 3 GB heap) and page faults when the
memory is reused. A fixed, lower mmap threshold would free them too, but measured 25-30 % slower
steps, since every mid-sized tensor then costs a fresh mapping.

Elsewhere (no glibc, or not Linux) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from typing import Any


@functools.cache
def _malloc_trim() -> Callable[[int], Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None


def trim() -> bool:
    """Return the heap's free pages to the OS; False where the C library cannot."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
