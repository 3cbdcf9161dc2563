"""EXPLAIN of a cut, as records: the super-plan and, per fragment, what was pushed and how.

``Decomposition.explained`` and ``Fragment.explained`` build them (``to_json`` is theirs); the
coordinator's EXPLAIN (``coordinator.query.explain.Explain``) holds one under ``cut`` and spreads
its fields into its JSON. docs/explain.md shows the whole shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from quarry.plan.statistics import SliceStatistic
from quarry.protocol.stage import Stage
from quarry.pushdown import Pushdown
from quarry.records import Record


@dataclass(frozen=True)
class Column(Record):
    name: str
    type: str  # Arrow's name of it ("int64", "decimal128(15, 2)")

    @classmethod
    def of(cls, schema: pa.Schema) -> tuple[Column, ...]:
        return tuple(cls(f.name, str(f.type)) for f in schema)


@dataclass(frozen=True)
class FragmentExplain(Record):
    """One sub-plan: the dataset it reads, what was pushed into it, where each part runs."""

    name: str
    dataset: str
    pushed: tuple[str, ...]  # operators, in the order the rules moved them
    device_stages: tuple[Stage, ...]  # the stages its devices can run
    capabilities: str
    predicates: tuple[Mapping[str, Any], ...]  # zone-map conjuncts
    device_filter: tuple[str, ...]
    host_filter: tuple[str, ...]  # conjuncts only the host checks
    notes: tuple[str, ...]
    raw_schema: tuple[Column, ...]
    output_schema: tuple[Column, ...]
    stage_bytes: Mapping[Stage, int]  # Substrait bytes of each stage
    statistics: tuple[SliceStatistic, ...]  # answered from slice statistics, when it can be
    plan: str  # its whole sub-plan, as DataFusion shows it


@dataclass(frozen=True)
class PlanExplain(Record):
    """The cut: the super-plan the host runs and the sub-plans the devices are offered."""

    pushdown: Pushdown
    super_plan: str
    super_plan_passthrough: str | None  # the one fragment streamed as it arrives, if so
    output_schema: tuple[Column, ...]
    fragments: tuple[FragmentExplain, ...]


@dataclass(frozen=True)
class RuleFired(Record):
    """EXPLAIN VERBOSE: a rule that changed the cut, and the cut after it."""

    rule: str
    plan: str
