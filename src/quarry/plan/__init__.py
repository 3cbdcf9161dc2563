"""Query decomposition: SQL cut into a host super-plan and Substrait sub-plans for devices.

See docs/plan.md. The coordinator calls `decompose`, ships each fragment's stages to devices,
which call `run_stage` per slice range; the host `complete`s whatever came back unfinished and
calls `run_super`.
"""

from quarry.errors import HostMemoryExceeded
from quarry.plan.capabilities import Capabilities
from quarry.plan.decompose import (
    DECOMPOSITION_RULES,
    PLAN_RULES,
    RULES,
    Decomposition,
    Fragment,
    decompose,
)
from quarry.plan.errors import PlanError, StageError
from quarry.plan.memory import SUPER_PLAN_MEMORY_BYTES_MAX
from quarry.plan.prune import slice_may_match, slice_must_match
from quarry.plan.stage import run_stage
from quarry.plan.superplan import complete, run_super

__all__ = [
    "DECOMPOSITION_RULES",
    "PLAN_RULES",
    "RULES",
    "SUPER_PLAN_MEMORY_BYTES_MAX",
    "Capabilities",
    "Decomposition",
    "Fragment",
    "HostMemoryExceeded",
    "PlanError",
    "StageError",
    "complete",
    "decompose",
    "run_stage",
    "run_super",
    "slice_may_match",
    "slice_must_match",
]
