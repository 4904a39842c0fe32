"""What this machine has: its physical memory, for the guards that refuse runs it
cannot hold (a simulation too large, a local replay with too many ranks)."""

from __future__ import annotations

import os

__all__ = ["machine_memory"]


def machine_memory() -> float | None:
    """Physical memory in bytes (None where the system does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
