"""What a class of device can evaluate (POLARDB §3.1.1, §3.2.2; DESIGN.md §5).

A DataFusion device runs any sub-plan (`full`). A scan engine such as ScaleFlux's evaluates
only comparisons between columns and literals, null tests, AND and OR (`scan_filter`): it
cannot compute expressions or aggregate, so it runs at most the `filter` stage, and the host
re-checks the whole predicate when it completes the fragment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from substrait import algebra_pb2

from quarry.plan import expressions, tree

SCAN_FILTER_FUNCTIONS = frozenset(
    {"equal", "not_equal", "lt", "lte", "gt", "gte", "is_null", "is_not_null", "and", "or"}
)


@dataclass(frozen=True)
class Capabilities:
    name: str
    # None: any deterministic, row-local predicate; else only these Substrait functions.
    filter_functions: frozenset[str] | None = None
    project_expressions: bool = True
    aggregate: bool = True
    limit: bool = True

    @classmethod
    def full(cls) -> Capabilities:
        return cls("full")

    @classmethod
    def scan_filter(cls) -> Capabilities:
        return cls(
            "scan_filter",
            SCAN_FILTER_FUNCTIONS,
            project_expressions=False,
            aggregate=False,
            limit=False,
        )

    @classmethod
    def named(cls, name: str) -> Capabilities:
        known = {"full": cls.full, "scan_filter": cls.scan_filter}
        if name not in known:
            raise ValueError(f"unknown capabilities {name!r}; known: {', '.join(sorted(known))}")
        return known[name]()

    @property
    def is_full(self) -> bool:
        return (
            self.filter_functions is None
            and self.project_expressions
            and self.aggregate
            and self.limit
        )

    def supports_predicate(
        self, expression: algebra_pb2.Expression, names: Mapping[int, str]
    ) -> bool:
        """Whether a device with these capabilities can evaluate this (row-local) predicate."""
        if self.filter_functions is None:
            return True
        return self._supported(expression, names)

    def runs_whole(self, rel: algebra_pb2.Rel, names: Mapping[int, str]) -> bool:
        """Whether a device with these capabilities runs this whole relation: reads, filters
        whose every conjunct it evaluates, projections that only select columns. Such a device
        ships the stage's output itself, and nobody above re-checks it."""
        if self.is_full:
            return True
        for part in tree.iter_rels(rel):
            kind = tree.kind(part)
            if kind == "read":
                continue
            if kind == "filter" and all(
                self.supports_predicate(c, names)
                for c in expressions.conjuncts(part.filter.condition, names)
            ):
                continue
            if kind == "project" and all(
                expressions.field_index(e) is not None for e in part.project.expressions
            ):
                continue
            return False
        return True

    def _supported(self, expression: algebra_pb2.Expression, names: Mapping[int, str]) -> bool:
        name = expressions.function_name(expression, names)
        if name is None or name not in self.filter_functions:
            return False
        parts = expressions.arguments(expression)
        if name in ("and", "or"):
            return all(self._supported(part, names) for part in parts)
        if name in expressions.NULL_TESTS:
            return len(parts) == 1 and expressions.field_index(parts[0]) is not None
        # A comparison: a scan engine compares stored fields and constants, nothing computed.
        return len(parts) == 2 and all(
            expressions.field_index(part) is not None or part.WhichOneof("rex_type") == "literal"
            for part in parts
        )

    def intersect(self, other: Capabilities) -> Capabilities:
        """What both can do: for a dataset spread over devices of different profiles."""
        if self.filter_functions is None:
            functions = other.filter_functions
        elif other.filter_functions is None:
            functions = self.filter_functions
        else:
            functions = self.filter_functions & other.filter_functions
        name = self.name if self == other else f"{self.name}&{other.name}"
        return Capabilities(
            name,
            functions,
            self.project_expressions and other.project_expressions,
            self.aggregate and other.aggregate,
            self.limit and other.limit,
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "filter_functions": (
                None if self.filter_functions is None else sorted(self.filter_functions)
            ),
            "project_expressions": self.project_expressions,
            "aggregate": self.aggregate,
            "limit": self.limit,
        }


def of_profile(kind: str) -> Capabilities:
    """What a device of a profile's capability class evaluates of a sub-plan."""
    if kind == "kernels":  # an FPGA running built-in kernels evaluates no SQL
        return Capabilities(
            "kernels", frozenset(), project_expressions=False, aggregate=False, limit=False
        )
    return Capabilities.named(kind)


def per_dataset(
    holders: Mapping[str, Iterable[str]], device_kinds: Mapping[str, str]
) -> dict[str, Capabilities]:
    """What every device holding a dataset can evaluate: the intersection of their profiles.

    ``holders`` maps a dataset to the devices that hold any of its partitions, ``device_kinds``
    a device to its profile's capability class. Datasets every holder runs in full are left out.
    """
    result: dict[str, Capabilities] = {}
    for dataset, devices in holders.items():
        names = sorted(set(devices))
        if not names:
            continue
        combined = of_profile(device_kinds.get(names[0], "full"))
        for name in names[1:]:
            combined = combined.intersect(of_profile(device_kinds.get(name, "full")))
        if not combined.is_full:
            result[dataset] = combined
    return result
