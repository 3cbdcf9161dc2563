"""EXPLAIN and EXPLAIN ANALYZE of a query: the cut, the cost model's choice, and afterwards what
each device did (its decisions, slices, rows and bytes read and shipped, CPU seconds). EXPLAIN
VERBOSE adds the rules that fired, in order, each with the cut it left (``rules``)."""

from __future__ import annotations

from typing import Any

from quarry.coordinator.dispatch.report import WorkReport, per_device, per_level
from quarry.plan.decompose import Decomposition


def explain(
    sql: str,
    pushdown: str,
    decomposition: Decomposition,
    choices: dict[str, Any],
    verbose: bool = False,
) -> dict[str, Any]:
    body = {"query": sql, **decomposition.to_json(), "pushdown": pushdown}
    body["plan"] = decomposition.explain()
    if choices:
        body["cost_model"] = choices
    if verbose:  # rendered now, from the bytes each rule left: only when asked
        body["rules"] = [fired.to_json() for fired in decomposition.fired]
    return body


def analyze(
    reports: list[WorkReport],
    host_cpu_s: float,
    wall_s: float,
    rows: int,
    servers: set[str] = frozenset(),
) -> dict[str, Any]:
    partitions = [r.to_json() for r in sorted(reports, key=lambda r: (r.label, r.partition))]
    levels = per_level(reports, servers)
    return {
        **({"levels": levels} if levels else {}),
        "devices": per_device(reports),
        "partitions": partitions,
        "bytes_shipped": sum(r.bytes_shipped for r in reports),
        "bytes_read": sum(r.bytes_read for r in reports),
        "host_cpu_s": host_cpu_s,
        # of which decompressing raw slices that came as stored (POLARDB §3.2)
        "host_decode_s": sum(r.decode_s for r in reports),
        "wall_s": wall_s,
        "rows": rows,
    }
