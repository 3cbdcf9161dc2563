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

A range that goes back to the host (``raw`` or ``filter``) goes back for one ``PushBack`` reason,
counted per reason wherever push-backs are counted (``protocol.counters``).
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


class PushBack(StrEnum):
    """Why a range came back to the host (Exadata counts "offload declined" by reason): a
    small fixed set, a label of the devices' metrics (``quarry_pushed_back_slices_total``)."""

    BUSY = "busy"  # the device's load: background work, or work waiting for its cores
    SLOW = "slow"  # measured: on an idle device the host path costs less (Eq. 1)
    MEMORY = "memory"  # the stage ran out of memory on the device
    CAPABILITY = "capability"  # the device cannot run that operator or plan
    FAILED_STAGE = "failed_stage"  # the stage failed on the device (engine error, panic)
    QUARANTINE = "quarantine"  # the plan's shape failed here before (``device.quarantine``)
    FORCED = "forced"  # the request said so (a caller's forced decision, ``pushdown=server``)
