"""How much host memory a super-plan may hold, and how EXPLAIN says where it holds it.

A super-plan's host memory is one budget (``SUPER_PLAN_MEMORY_BYTES_MAX``, or
``$QUARRY_SUPER_PLAN_MEMORY_MIB``): a quarter holds fragment outputs in memory (the spool, the
rest on disk), the remainder is DataFusion's spill pool. ``memory_summary`` reads the super-plan's
operators to tell which keep little by themselves (top-k, final aggregation of partials), which
spill (sorts, aggregations of raw rows, joins: a hash join whose build side does not fit runs
again as a sort-merge join) and which may have to fit (the build side of a join on no equal
keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from substrait import algebra_pb2

from quarry import machine, settings
from quarry.errors import QueryError
from quarry.plan import expressions, tree
from quarry.plan.rowwise import GROUP_BYTES_MAX, rowwise_fragment
from quarry.plan.spool import MIB

# Host memory for one query, stated: the super-plan's budget (fragment outputs held for it plus
# DataFusion's pool) and what completing handed-back rows holds (at most one 4 MiB group per
# host core at a time, plus the streams' bounded queues). bench/memory.py measures the sum.
# A sixteenth of the machine's memory, between 512 MiB and 4 GiB: the host runs two long
# queries a core at once (``coordinator.workload``), so on two cores four of them hold a
# quarter of it, the rest left to the devices' page cache. A fixed 512 MiB made TPC-H SF 10's
# Q10 and Q18 run their joins twice on a 24 GiB machine (a hash join's build side did not fit,
# sort-merge after): Q10 6.1 s against 3.5 with 1.5 GiB.
QUERY_HOST_MEMORY_SHARE = 16
QUERY_HOST_MEMORY_BYTES_LOW = 512 * MIB
QUERY_HOST_MEMORY_BYTES_HIGH = 4096 * MIB


def query_host_memory_bytes(machine_bytes: int) -> int:
    share = machine_bytes // QUERY_HOST_MEMORY_SHARE // MIB * MIB
    return min(max(share, QUERY_HOST_MEMORY_BYTES_LOW), QUERY_HOST_MEMORY_BYTES_HIGH)


QUERY_HOST_MEMORY_BYTES_MAX = query_host_memory_bytes(machine.memory_bytes())
COMPLETION_MEMORY_BYTES = 128 * MIB  # set aside for completion, queues and the scans' buffers
SUPER_PLAN_MEMORY_BYTES_MAX = QUERY_HOST_MEMORY_BYTES_MAX - COMPLETION_MEMORY_BYTES
# The spool's in-memory share is 1 / SPOOL_MEMORY_SHARE of the budget; the pool gets the rest.
SPOOL_MEMORY_SHARE = 4
SUPER_PLAN_MEMORY_BYTES_MIN = 8 * MIB  # below this a spilled sort cannot even merge its runs


@dataclass(frozen=True)
class MemoryBudget:
    """How a super-plan's host memory is shared: spool in memory, DataFusion's pool."""

    bytes_max: int
    spool_memory_bytes_max: int

    @property
    def pool_bytes(self) -> int:
        return self.bytes_max - self.spool_memory_bytes_max

    @classmethod
    def of(
        cls, bytes_max: int | None = None, spool_memory_bytes_max: int | None = None
    ) -> MemoryBudget:
        total = default_memory_bytes_max() if bytes_max is None else bytes_max
        if total < SUPER_PLAN_MEMORY_BYTES_MIN:
            raise QueryError(
                f"the super-plan memory budget is {total} bytes; it must be at least "
                f"{SUPER_PLAN_MEMORY_BYTES_MIN // MIB} MiB"
            )
        spool = (
            total // SPOOL_MEMORY_SHARE
            if spool_memory_bytes_max is None
            else spool_memory_bytes_max
        )
        assert 0 <= spool < total, f"spool memory {spool} must leave a pool within {total} bytes"
        return cls(total, spool)


def default_memory_bytes_max() -> int:
    """$QUARRY_SUPER_PLAN_MEMORY_MIB in MiB if set, else `SUPER_PLAN_MEMORY_BYTES_MAX`."""
    mib = settings.SUPER_PLAN_MEMORY_MIB.get()
    return SUPER_PLAN_MEMORY_BYTES_MAX if mib is None else mib * MIB


JOIN_RELS = ("join", "cross", "hash_join", "merge_join", "nested_loop_join")
# A hash join's build side that does not fit makes the super-plan run again with sort-merge
# joins (superplan.py). A join on no equal keys has no such way out: DataFusion runs it as a
# cross join, which holds its build side whole, or a nested-loop join, which spills it for most
# kinds of join.
JOIN_HOLDS = "a join that does not fit runs again as a sort-merge join that spills"
NO_EQUAL_KEYS_HOLDS = "a join on no equal keys may need its build side to fit the budget"


def memory_summary(decomposition: Any, budget: MemoryBudget | None = None) -> str:
    """How a (not pass-through) super-plan holds data, in words for EXPLAIN."""
    rowwise = rowwise_fragment(decomposition)
    if rowwise is not None:
        return (
            f"runs row by row over {rowwise.name} as it arrives, in groups of at most "
            f"{GROUP_BYTES_MAX // MIB} MiB (no spool)"
        )
    budget = budget or MemoryBudget.of()
    if decomposition.host_sql:
        return (
            f"streams fragments into a spool of at most "
            f"{budget.spool_memory_bytes_max // MIB} MiB in memory, the rest on disk; DuckDB "
            f"runs the query over them in {budget.pool_bytes // MIB} MiB, spilling beyond it"
        )
    plan = tree.parse_plan(decomposition.super_plan)
    partial = {f.name for f in decomposition.fragments if "partial_aggregate" in f.pushed}
    functions = tree.function_names(plan)
    holds: list[str] = []
    top_k_sorts = 0  # sorts right under a fetch: DataFusion runs them as top-k
    sorts = 0
    for rel in tree.iter_rels(plan):
        rel_kind = tree.kind(rel)
        if rel_kind == "fetch" and tree.kind(rel.fetch.input) == "sort":
            top_k_sorts += 1
            holds.append(f"top-k keeps {_fetch_rows(rel.fetch)} rows")
        elif rel_kind == "sort":
            sorts += 1
        elif rel_kind == "aggregate":
            if _reads_only(rel.aggregate.input, partial):
                holds.append("aggregates partials")
            else:
                holds.append("aggregate spills beyond the budget")
        elif rel_kind == "join" and not _on_equal_keys(rel.join.expression, functions):
            holds.append(NO_EQUAL_KEYS_HOLDS)
        elif rel_kind in JOIN_RELS or (
            rel_kind == "set" and rel.set.op != algebra_pb2.SetRel.SET_OP_UNION_ALL
        ):
            holds.append(JOIN_HOLDS)
    if sorts > top_k_sorts:
        holds.append("sort spills beyond the budget")
    for message in tree.iter_messages(plan):
        if isinstance(message, algebra_pb2.Expression.Subquery):
            holds.append(JOIN_HOLDS)  # subqueries become joins
        elif isinstance(message, algebra_pb2.Expression.WindowFunction):
            holds.append("window sort spills beyond the budget")
    summary = (
        f"streams fragments into a spool of at most {budget.spool_memory_bytes_max // MIB} MiB "
        f"in memory, the rest on disk; runs in a {budget.pool_bytes // MIB} MiB spill pool"
    )
    unique = list(dict.fromkeys(holds))
    return summary + (": " + ", ".join(unique) if unique else "")


def _on_equal_keys(condition: algebra_pb2.Expression, functions: Mapping[int, str]) -> bool:
    """Whether a join condition matches equal keys (an `=`, or `is not distinct from` as set
    operations match, alone or among `and`-ed terms): the joins DataFusion runs as hash or
    sort-merge joins."""
    terms = [condition]
    while terms:
        term = terms.pop()
        if term.WhichOneof("rex_type") != "scalar_function":
            continue
        name = functions.get(term.scalar_function.function_reference)
        if name in ("equal", "is_not_distinct_from"):
            return True
        if name == "and":
            terms.extend(argument.value for argument in term.scalar_function.arguments)
    return False


def _fetch_rows(fetch: algebra_pb2.FetchRel) -> str:
    """The rows a top-k keeps: its count plus offset, as DataFusion's producer writes them."""
    count = expressions.literal_int(fetch.count_expr) if fetch.HasField("count_expr") else None
    offset = expressions.literal_int(fetch.offset_expr) if fetch.HasField("offset_expr") else 0
    if count is None or count < 0 or offset is None:
        return "its"
    return f"{count + offset:,}"


def _reads_only(rel: algebra_pb2.Rel, fragments: set[str]) -> bool:
    """Whether every read under `rel` reads one of `fragments` (no join in between)."""
    reads = [tree.named_table(r) for r in tree.iter_rels(rel) if tree.kind(r) == "read"]
    kinds = {tree.kind(r) for r in tree.iter_rels(rel)}
    return (
        bool(reads)
        and not kinds & set(JOIN_RELS)
        and all(names is not None and len(names) == 1 and names[0] in fragments for names in reads)
    )
