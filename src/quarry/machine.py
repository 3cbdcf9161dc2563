"""What the machine a process runs on has: its memory, and how much of it is to spare now.

Defaults that scale with the machine read it here (a super-plan's memory budget,
``plan/memory.py``; a device's column cache, ``device/column_cache.py``).
"""

from __future__ import annotations

import os

MEMINFO = "/proc/meminfo"


def memory_bytes() -> int:
    """The machine's physical memory (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def available_bytes() -> int | None:
    """Memory the kernel could give out now without swapping (free, and page cache it can
    drop: ``MemAvailable``); None where the system does not say."""
    try:
        with open(MEMINFO, "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
