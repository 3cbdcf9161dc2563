"""How much of a unit of work a device ran on a slice range, and what it skipped.

Stages, from least to most work on the device (the host completes whatever is left):

    raw     nothing: the device ships the slices as stored (push back)
    filter  scan + filter only; the host runs the rest on what passed
    full    the whole unit of work; its output streams back

The same names serve the planner (the stages of a fragment), the cost model (the cut it
chooses), the device controller (its decision per slice range) and the host dispatch (what it
must complete). A range a device never ran is ``pruned`` (zone maps exclude every row),
``cached`` (a stored partial result covers it) or ``answered`` (its zone maps' statistics are
the output: ``count``, ``sum``, ``min``, ``max`` over slices every row of which passes).
"""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    RAW = "raw"
    FILTER = "filter"
    FULL = "full"

    @property
    def pushed_back(self) -> bool:
        """The host must finish this range."""
        return self is not Stage.FULL


# In order of data shipped, least first: the cost model prefers the earlier of two near-equal
# cuts, because a cut that ships more must win clearly.
STAGES_BY_DATA_SHIPPED: tuple[Stage, ...] = (Stage.FULL, Stage.FILTER, Stage.RAW)


class Skip(StrEnum):
    PRUNED = "pruned"
    CACHED = "cached"
    ELSEWHERE = "elsewhere"  # done by another replica before it stopped answering
    ANSWERED = "answered"  # the slices' statistics are the unit's output: nothing read
