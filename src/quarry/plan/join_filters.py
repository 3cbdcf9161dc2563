"""join_filters: which fragments a join lets the host cut down by the keys of another.

A join on the host keeps only the rows of one input whose key is among the other's. When that
other input is a small, filtered fragment (TPC-H Q17's 200 parts of one brand and container),
its keys, known once it has arrived, can go down to the devices of the large fragment (the six
million lineitems) as ``key IN (...)``: they ship the rows that can match, not all of them
(sideways information passing; Skytether §4 pushes work to where the data is, this pushes the
join's knowledge there too).

This module only finds the pairs, on the super-plan as it stands; the coordinator collects the
keys and sends the probe fragment once they are in (``coordinator.join_keys``). A pair is kept
only where the cut cannot change the answer:

- the join compares the two columns with ``=`` (NULL never matches) and its type drops rows of
  the probe side that match nothing (inner; the null-supplying side of an outer join; either
  side of a semi join; the filtering side of an anti join);
- between the probe fragment and the join, every operator commutes with a filter on that column:
  filters, projections that pass it on, sorts, aggregates grouping by it, inner joins, the
  preserved side of outer, semi and anti joins, and unions, into each input (no LIMIT);
- every read of the probe fragment in the super-plan is cut by the same pair: the fragment's
  rows are shared by its reads (TPC-H Q2 reads partsupp's fragment in the query and in its
  subquery, each joined to part's keys; Q21's second read of lineitem is not, and is not cut);
- the build column comes unchanged from a build fragment's output (its rows may be fewer by the
  time they reach the join: the keys are then a superset, which cuts less but never wrongly).

A build may also be what the super-plan makes of a fragment on the host before the join, when
that is a filter over it (TPC-H Q18's ``IN (SELECT l_orderkey ... GROUP BY l_orderkey HAVING
sum(l_quantity) > 300)``: 57 of 1.5 million orders at SF 1). The pair then carries that part of
the super-plan (``through``): the host runs it over the build fragment's output once it is in,
and the keys are its output's. Such a build reads one fragment and joins nothing; how few keys
its filter leaves is known only when they are in, so its size is not weighed (more than
``keys.KEYS_MAX`` are not sent, and the probe only started late). Through an inner join's
``a = b`` a filter on ``a`` is one on ``b`` too: a probe column found on one side of such a join
is also found on the other (Q18 cuts both orders and the lineitems joined to them); and a build
column found on one side of such a join below the build side's way down also has its keys in
the other side's fragment (Q9 cuts partsupp by the keys of the green parts the lineitems it
joins were joined to).

Which pairs pay is weighed on the rows each side outputs, estimated: a fragment's dataset's
rows, times the share of them its filter keeps on a slice the host samples (``planning.
kept_rows``, the cost model's sample), times, for each cut chosen before, the share its build
keeps of its own dataset. A pair pays when its build is filtered or cut (an unfiltered build's
keys are all of them), its estimated rows are at most ``keys.KEYS_MAX`` (more keys are not
sent, and the probe would have waited for nothing), and at most a ``PROBE_ROWS_RATIO``th of
the probe's own output. The probe waits for its build; TPC-H SF 1 Q3, Q4 and Q10, cutting
lineitem by the keys of a quarter as many orders, are faster for it all the same (0.32 -> 0.18
s, 0.16 -> 0.10 s, 0.29 -> 0.20 s): shipping and joining the rows a cut drops costs the host
more than the wait. Sizing by datasets alone, as this module first did, missed Q12 (a filter
keeps one lineitem in 200, whose keys cut orders four times smaller) and at SF 10 made pairs
whose keys came out too many to send (1.5 million orders' keys for Q3's lineitem: 5.1 s
against 2.7 with the limit raised to let them through). A fifth, not a quarter: Q9's orders,
cut by the 320,000 lineitems of green parts (a 4.7th of orders), took 0.47 s against 0.39
uncut; Q5's, cut by 30,000 customers' keys (a 7.8th), are faster for it. The estimate is a
sample's: a wrong one costs the probe its wait, never the answer. A pair must end, through
builds that are probes in turn (Q5: region, nation, supplier, lineitem), at a probe of at least
``PROBE_ROWS_MIN`` rows: below that, shipping it whole costs less than the wait (TPC-H SF 0.05,
Q5: 0.13 s uncut, 0.19 s cut along the whole chain).
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from substrait import algebra_pb2, plan_pb2

from quarry.plan import keys, tree
from quarry.plan.decompose import Decomposition, Fragment
from quarry.plan.fields import equalities, step_down, unmapped, width
from quarry.protocol.stage import Stage

PROBE_ROWS_RATIO = 5
PROBE_ROWS_MIN = 500_000
UNION_SHARE_MAX = 0.2  # of its rows a probe read once for several builds may keep
SHAPES_KEPT_MAX = 256  # super-plans whose pairs are kept
J = algebra_pb2.JoinRel
# The sides of a join whose rows the join drops when unmatched (a probe may be cut there)...
_CUT_SIDES = {
    J.JOIN_TYPE_INNER: ("left", "right"),
    J.JOIN_TYPE_LEFT: ("right",),
    J.JOIN_TYPE_RIGHT: ("left",),
    J.JOIN_TYPE_LEFT_SEMI: ("left", "right"),
    J.JOIN_TYPE_RIGHT_SEMI: ("left", "right"),
    J.JOIN_TYPE_LEFT_ANTI: ("right",),
    J.JOIN_TYPE_RIGHT_ANTI: ("left",),
}
# What the host may run of a build side before its keys are taken (``through``).
_THROUGH_KINDS = ("read", "filter", "project", "aggregate", "sort")
# set operations a filter on a column passes into every input of (a probe may be cut in each)
_UNIONS = (algebra_pb2.SetRel.SET_OP_UNION_ALL, algebra_pb2.SetRel.SET_OP_UNION_DISTINCT)


@dataclass(frozen=True)
class JoinFilter:
    """Cut ``probe``'s output to the rows whose ``probe_column`` is among the values of
    ``build``'s ``build_column`` (output column positions); with ``through``, among the values
    of column ``through_column`` of that plan (the super-plan's part between the build
    fragment and the join, reading the fragment by its name) run over the build's output."""

    probe: str
    probe_column: int
    build: str
    build_column: int
    through: bytes = b""
    through_column: int = -1
    # the build column is not the join's own but equal to it through an inner join below
    equal: bool = False
    # other fragments ``through`` reads, in subqueries of its filter (``d_month_seq = (SELECT
    # ...)``): it runs once they are in too
    through_reads: tuple[str, ...] = ()
    # more builds (fragment, column) whose keys join the build's in one set: the probe is one
    # fragment read at several joins, each read cut by a build of its own (``_unions``)
    also: tuple[tuple[str, int], ...] = ()

    @property
    def builds(self) -> tuple[str, ...]:
        """Every fragment whose keys the cut takes."""
        return (self.build, *(name for name, _ in self.also))

    def members(self) -> tuple[JoinFilter, ...]:
        """A union's pairs, one a build (itself, for a pair of one build)."""
        if not self.also:
            return (self,)
        return tuple(
            JoinFilter(self.probe, self.probe_column, name, column)
            for name, column in ((self.build, self.build_column), *self.also)
        )

    def describe(self, fragments: Mapping[str, Fragment]) -> str:
        probe = fragments[self.probe].output_schema.names[self.probe_column]
        builds = " ∪ ".join(
            f"{m.build}.{fragments[m.build].output_schema.names[m.build_column]}"
            for m in self.members()
        )
        after = " after the host's filter" if self.through else ""
        return f"{self.probe}.{probe} IN (keys of {builds}{after})"


def join_filters(
    decomposition: Decomposition,
    rows: Mapping[str, int],
    kept: Mapping[str, float] | None = None,
    spans: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[JoinFilter, ...]:
    """The pairs worth cutting, for datasets of ``rows`` rows of which each fragment's filter
    keeps the share ``kept`` says (by fragment name; all of them when it does not say), whose
    integer columns hold values over the ``spans`` given (by dataset and column). Worked out
    once per super-plan and what they depend on of its fragments (``_Side``): walking the
    super-plan for every query took a sixth of the host's CPU on TPC-H's small queries."""
    if len(decomposition.fragments) < 2 or decomposition.host_sql:  # DuckDB's joins: unseen
        return ()
    sides = tuple(
        (
            f.name,
            _Side(
                f.dataset,
                f.capabilities,
                tuple(f.device_stages),
                bool(f.device_filter or f.host_filter),
                rows.get(f.dataset, 0),
                (kept or {}).get(f.name, 1.0),
                _output_spans(f, (spans or {}).get(f.dataset, {})),
            ),
        )
        for f in decomposition.fragments
    )
    return _join_filters(decomposition.super_plan, sides)


def _output_spans(fragment: Fragment, spans: Mapping[str, int]) -> tuple[int | None, ...]:
    """Per output column of the fragment, the span of the stored column it comes from."""
    if not spans:
        return ()
    columns = _stored_columns(fragment.stages[Stage.FULL], len(fragment.output_schema))
    return tuple(None if column is None else spans.get(column) for column in columns)


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def _stored_columns(stage: bytes, width: int) -> tuple[str | None, ...]:
    """Each output column's stored column (``stored_column``), once per sub-plan: asked for
    every fragment of every query, before the pairs' own cache is looked in."""
    plan = tree.parse_plan(stage)
    return tuple(stored_column(plan, i) for i in range(width))


@dataclass(frozen=True)
class _Side:
    """What the pairs depend on of one fragment."""

    dataset: str
    capabilities: str
    device_stages: tuple[Stage, ...]
    filtered: bool
    rows: int  # its dataset's
    kept: float  # the share of them its filter keeps
    spans: tuple[int | None, ...] = ()  # per output column: values between its least and most

    @property
    def own(self) -> float:
        """The rows it outputs, cut by no key set."""
        return self.rows * self.kept

    def span(self, column: int) -> int | None:
        return self.spans[column] if column < len(self.spans) else None


@functools.lru_cache(maxsize=SHAPES_KEPT_MAX)
def _join_filters(
    super_plan: bytes, sides: tuple[tuple[str, _Side], ...]
) -> tuple[JoinFilter, ...]:
    fragments = dict(sides)
    plan = tree.parse_plan(super_plan)
    names = tree.function_names(plan)
    rels = list(tree.iter_rels(plan))  # kept alive: a read is known by its object's id
    reads = Counter(t[0] for rel in rels if (t := tree.named_table(rel)) and len(t) == 1)
    covered: dict[JoinFilter, set[int]] = defaultdict(set)
    for rel in rels:
        if tree.kind(rel) == "join":
            for pair, read in _pairs(rel.join, names, plan):
                covered[pair].add(id(read))
    found = {
        pair
        for pair, at in covered.items()
        if len(at) == reads[pair.probe] and _may_cut(pair, fragments)
    }
    found |= {u for u in _unions(covered, reads, found) if _may_cut(u, fragments)}
    chosen = _ending_large(_thin_unions(_chosen(found, fragments), fragments), fragments)
    return tuple(sorted(chosen, key=_order))


def _thin_unions(pairs: set[JoinFilter], fragments: Mapping[str, _Side]) -> set[JoinFilter]:
    """The pairs without the unions whose probe keeps more than ``UNION_SHARE_MAX`` of its
    rows, all cuts made. A union's probe is read once, but every read of it in the super-plan
    goes over what all its builds keep: one scan of the probe saved on the devices against
    that many more rows joined on the host, where a row costs some five times what a device's
    scan of it does. TPC-DS Q11's two years of store sales (two fifths of them) took 150 ms
    of the host's CPU read apart, 268 read once; Q75's two years of one category's sales, a
    twenty-fifth, 293 ms of wall read apart, 200 once."""
    unions = {p for p in pairs if p.also}
    if not unions:
        return pairs
    estimates = _estimates(pairs, fragments, by_span=True)
    thick = {
        p for p in unions if estimates[p.probe] > UNION_SHARE_MAX * max(1.0, fragments[p.probe].own)
    }
    return pairs - thick


def _unions(
    covered: Mapping[JoinFilter, set[int]], reads: Mapping[str, int], found: set[JoinFilter]
) -> set[JoinFilter]:
    """For a probe column no one pair cuts at every read of its fragment, one pair of the
    builds that together do: the union of their keys holds every key each read's join needs.
    TPC-DS Q31 joins store sales by date to three quarters, once each: the three reads, alike,
    were kept apart for their cuts (``split_alike_by_join_keys``) and the sales scanned three
    times; read once, cut by the three quarters' dates, they are scanned once."""
    whole = {(p.probe, p.probe_column) for p in found}
    partial: dict[tuple[str, int], list[JoinFilter]] = defaultdict(list)
    for pair, at in covered.items():
        plain = not (pair.through or pair.equal)
        if plain and (pair.probe, pair.probe_column) not in whole and len(at) < reads[pair.probe]:
            partial[(pair.probe, pair.probe_column)].append(pair)
    unions = set()
    for (probe, column), pairs in partial.items():
        if len(set().union(*(covered[p] for p in pairs))) < reads[probe]:
            continue
        first, *rest = sorted(pairs, key=_order)
        also = tuple((p.build, p.build_column) for p in rest)
        unions.add(JoinFilter(probe, column, first.build, first.build_column, also=also))
    return unions


def _order(pair: JoinFilter) -> tuple:
    return (pair.probe, pair.probe_column, pair.build, pair.build_column, pair.also)


def _may_cut(pair: JoinFilter, fragments: Mapping[str, _Side]) -> bool:
    builds = pair.builds
    if pair.probe in builds or pair.probe not in fragments:
        return False
    if not all(name in fragments for name in builds):
        return False
    if not all(name in fragments for name in pair.through_reads):
        return False
    probe = fragments[pair.probe]
    # a scan engine runs the filter stage only: its stream is not the output
    return probe.capabilities == "full" and Stage.FULL in probe.device_stages


def _chosen(found: set[JoinFilter], fragments: Mapping[str, _Side]) -> set[JoinFilter]:
    """Pairs through the host's filter first (their keys are what a HAVING leaves: Q18's 57
    orders); then, one at a time, the sized pair that pays with the smallest build, its rows
    estimated with the cuts chosen so far, until none pays; a build found through an equality
    (``equal``) only where the join's own build column does not pay. A probe column is cut once: a
    second build is most often cut by the same keys as the first (Q17's two lineitem
    fragments, each cut by part's), and would only make the probe wait longer. A pair that
    would make probes wait for each other in a circle is left out (Q18's lineitem aggregate
    waiting for the orders its HAVING cuts)."""
    kept: set[JoinFilter] = set()
    for pair in sorted((p for p in found if p.through), key=_order):
        if not any(_waits_for(kept, b, pair.probe) for b in (pair.build, *pair.through_reads)):
            kept.add(pair)
    while True:
        estimates = _estimates(kept, fragments)
        cut = {(p.probe, p.probe_column) for p in kept}
        paying = [
            (sum(estimates[b] for b in p.builds), _order(p), p)
            for p in found - kept
            if not p.through
            and (p.probe, p.probe_column) not in cut
            and _pays(p, estimates, kept, fragments)
            and not any(_waits_for(kept, b, p.probe) for b in p.builds)
            and not _same_keys_again(p, kept, fragments)
        ]
        direct = {(p.probe, p.probe_column) for _, _, p in paying if not p.equal}
        paying = [
            c for c in paying if not (c[2].equal and (c[2].probe, c[2].probe_column) in direct)
        ]
        if not paying:
            return kept
        kept.add(min(paying)[2])


def _same_keys_again(
    pair: JoinFilter, kept: set[JoinFilter], fragments: Mapping[str, _Side]
) -> bool:
    """Whether ``pair``'s build, unfiltered, is cut only through joins' equalities by builds
    that already cut its probe: its keys then say again what those builds' keys said, through
    another column, and its probe would wait for them. Q9's partsupp, cut by the green parts
    whose lineitems it joins (``equal``), holds nearly every supplier: cutting those lineitems'
    ``l_suppkey`` by them would drop nothing, and make orders' cut by lineitem look worth it."""
    if pair.also or fragments[pair.build].filtered or _waits_for(kept, pair.probe, pair.build):
        return False
    cutting_build = [p for p in kept if p.probe == pair.build]
    cutting_probe = {p.build for p in kept if p.probe == pair.probe}
    return bool(cutting_build) and all(p.equal and p.build in cutting_probe for p in cutting_build)


def _pays(
    pair: JoinFilter,
    estimates: Mapping[str, float],
    kept: set[JoinFilter],
    fragments: Mapping[str, _Side],
) -> bool:
    """Every build is filtered or cut (an uncut build's keys are all of them), their keys may
    be sent, and they are at most a ``PROBE_ROWS_RATIO``th of the rows its probe ships uncut."""
    for name in pair.builds:
        if not (fragments[name].filtered or any(p.probe == name for p in kept)):
            return False
    rows = sum(estimates[name] for name in pair.builds)
    return rows <= keys.KEYS_MAX and fragments[pair.probe].own >= PROBE_ROWS_RATIO * rows


def _estimates(
    kept: set[JoinFilter], fragments: Mapping[str, _Side], by_span: bool = False
) -> dict[str, float]:
    """Each fragment's rows after its filter and the cuts ``kept``: each build that cuts it
    keeps the share of it that the build keeps of its own dataset (the build column a key of
    it, its rows spread evenly), once however many columns it cuts: TPC-DS Q17's store sales
    cut by the item, customer and ticket of the same returns keep the rows of those returns,
    not that share cubed (which made them look smaller than a quarter's dates, and the dates
    wait for them). ``by_span``: a share of the values the probe column holds (``_share``).
    Pairs are chosen without: judged by their spans, the sales a year of dates cuts are as
    many as they are, and no longer cut the customers that TPC-DS Q4, Q11 and Q78 join them
    to (Q4: 389 -> 671 ms). A cut through the host's filter is not estimated."""
    found: dict[str, float] = {}

    def estimate(name: str) -> float:
        if name not in found:
            side = fragments[name]
            rows = side.own
            cuts = {(p.builds, p.probe_column) for p in kept if p.probe == name and not p.through}
            for builds in {b for b, _ in cuts}:  # a build's cut of several columns: once
                sized = [(estimate(b), fragments[b]) for b in builds]
                spans = [side.span(c) if by_span else None for b, c in cuts if b == builds]
                rows *= min(_share(span, sized) for span in spans)
            found[name] = rows
        return found[name]

    return {name: estimate(name) for name in fragments}


def _share(span: int | None, builds: list[tuple[float, _Side]]) -> float:
    """The share of a probe its builds' keys keep: of the values its column holds (``span``,
    or each build's dataset's rows when unknown), the builds' keys, every one taken to be
    among them (TPC-DS's year of dates keeps a fifth of the sales: 366 of the 1,823 dates they
    were sold on, not 0.5% of date_dim's 73,049)."""
    held = sum(rows / max(1, min(side.rows, span or side.rows)) for rows, side in builds)
    return min(1.0, held)


def _waits_for(pairs: set[JoinFilter], probe: str, build: str) -> bool:
    """Whether fragment ``probe`` waits, through ``pairs``, for fragment ``build``."""
    seen, frontier = set(), [probe]
    while frontier:
        name = frontier.pop()
        if name == build:
            return True
        if name not in seen:
            seen.add(name)
            for p in pairs:
                if p.probe == name:
                    frontier.extend((*p.builds, *p.through_reads))
    return False


def _ending_large(pairs: set[JoinFilter], fragments: Mapping[str, _Side]) -> set[JoinFilter]:
    """Pairs whose probe is large, or a build of a pair kept (to a fixed point)."""
    kept = {p for p in pairs if fragments[p.probe].rows >= PROBE_ROWS_MIN}
    while True:
        builds = {b for p in kept for b in p.builds}
        more = {p for p in pairs - kept if p.probe in builds}
        if not more:
            return kept
        kept |= more


def _pairs(
    join: algebra_pb2.JoinRel, names: Mapping[int, str], plan: plan_pb2.Plan | None = None
) -> list[tuple[JoinFilter, algebra_pb2.Rel]]:
    """The pairs this join makes, each with the read of the probe fragment it cuts there."""
    sides = _CUT_SIDES.get(join.type, ())
    found = []
    for low, high in equalities(join, names) if sides else []:
        ends = {"left": (join.left, low), "right": (join.right, high)}
        for probe_side in sides:
            build_side = "right" if probe_side == "left" else "left"
            build = trace(*ends[build_side], probe=False)
            if build is None:
                continue
            builds = [(build, _through(*ends[build_side], plan), False)]
            builds += [(equal, {}, True) for equal in _equal_builds(*ends[build_side], names)]
            for (name, column), read in _probes(*ends[probe_side], names):
                for (fragment, key), through, equal in builds:
                    pair = JoinFilter(name, column, fragment, key, equal=equal, **through)
                    if name not in pair.through_reads:
                        found.append((pair, read))
    return found


def _equal_builds(
    rel: algebra_pb2.Rel, index: int, names: Mapping[int, str]
) -> list[tuple[str, int]]:
    """Other fragment columns whose keys hold every value field ``index`` of a build side
    ``rel`` brings to the join: through an inner join's ``a = b`` on the field's way down,
    every row that reaches the join has ``a = b``, so ``b``'s fragment's keys are a superset
    of ``a``'s values. TPC-H Q9 joins partsupp to the lineitems of green parts, and cuts it
    by the keys of those 10,664 parts (``p_partkey = l_partkey``) rather than by the 320,000
    lineitems' (too many to pay): 800,000 partsupp rows shipped before, 43,000 after."""
    found = []
    for join, side, column in _inner_joins_on_path(rel, index, probe=False):
        for low, high in equalities(join, names):
            mine, other, other_rel = (
                (low, high, join.right) if side == "left" else (high, low, join.left)
            )
            if mine == column and (partner := trace(other_rel, other, probe=False)) is not None:
                found.append(partner)
    return found


def _through(rel: algebra_pb2.Rel, index: int, plan: plan_pb2.Plan | None) -> dict[str, Any]:
    """The build side as a plan of its own, when the host filters the build fragment's output
    before the join (``HAVING``, or a comparison with a subquery's value the devices cannot
    know: TPC-DS Q6's ``d_month_seq = (SELECT DISTINCT d_month_seq ...)``): its keys are then
    fewer than the fragment's. Only for a side that reads one fragment and joins nothing; its
    subqueries may read other fragments (returned: the plan runs once they are in too) but
    join nothing either. The pair's fields that say so; none when it is not such a side."""
    if plan is None:
        return {}
    chain: list[algebra_pb2.Rel] = []  # the side's own relations, down its inputs to the read
    below: algebra_pb2.Rel | None = rel
    while below is not None:
        chain.append(below)
        if tree.kind(below) not in _THROUGH_KINDS:
            return {}
        below = tree.single_input(below)
    kinds = [tree.kind(r) for r in chain]
    if "filter" not in kinds or kinds[-1] != "read":
        return {}
    own = {id(r) for r in chain}
    build = tree.named_table(chain[-1])
    extra: set[str] = set()
    for r in tree.iter_rels(rel):  # what subqueries of the side's expressions read
        if id(r) in own:
            continue
        name = tree.named_table(r)
        if tree.kind(r) not in _THROUGH_KINDS or (tree.kind(r) == "read" and name is None):
            return {}
        if name is not None and name != build:  # the build's own rows are kept already
            extra.add(".".join(name))
    return {
        "through": tree.make_plan(plan, rel).SerializeToString(),
        "through_column": index,
        "through_reads": tuple(sorted(extra)),
    }


def _probes(
    rel: algebra_pb2.Rel, index: int, names: Mapping[int, str]
) -> list[tuple[tuple[str, int], algebra_pb2.Rel]]:
    """Every fragment column a filter on field ``index`` of ``rel`` can move to, each with the
    read it is found at: the one it comes from, and through an inner join's ``a = b``, the
    other side's too."""
    found = _traced_branches(rel, index)
    for join, side, column in _inner_joins_on_path(rel, index):
        for low, high in equalities(join, names):
            mine, other, other_rel = (
                (low, high, join.right) if side == "left" else (high, low, join.left)
            )
            if mine == column and (partner := _traced(other_rel, other, probe=True)) is not None:
                found.append(partner)
    return found


def _traced_branches(
    rel: algebra_pb2.Rel, index: int
) -> list[tuple[tuple[str, int], algebra_pb2.Rel]]:
    """``_traced`` for a probe, and on into every input of a union: a filter on a union's
    column is one on that column of each of its inputs, and each input cuts on its own (TPC-DS
    Q5's store sales and returns, joined as one to a fortnight of dates). An input that does
    not trace is left whole; cutting the others is still right."""
    while tree.kind(rel) != "read":
        if tree.kind(rel) == "set":
            here = unmapped(rel, index)
            if rel.set.op not in _UNIONS or here is None:
                return []
            return [found for branch in rel.set.inputs for found in _traced_branches(branch, here)]
        step = step_down(rel, index, probe=True)
        if step is None:
            return []
        rel, index = step
    here = unmapped(rel, index)
    column = None if here is None else _read(rel.read, here)
    return [] if column is None else [(column, rel)]


def _inner_joins_on_path(
    rel: algebra_pb2.Rel, index: int, probe: bool = True
) -> list[tuple[algebra_pb2.JoinRel, str, int]]:
    """The inner joins field ``index`` of ``rel`` passes through on its way down (as ``trace``
    follows it, for a probe or not), each with the side and column it comes from there."""
    found = []
    while tree.kind(rel) != "read":
        here = unmapped(rel, index)
        if here is not None and tree.kind(rel) == "join" and rel.join.type == J.JOIN_TYPE_INNER:
            left_width = width(rel.join.left)
            if left_width is not None:
                side = "left" if here < left_width else "right"
                found.append((rel.join, side, here if side == "left" else here - left_width))
        step = step_down(rel, index, probe)
        if step is None:
            return found
        rel, index = step
    return found


def trace(rel: algebra_pb2.Rel, index: int, probe: bool) -> tuple[str, int] | None:
    """The fragment and output column that field ``index`` of ``rel`` comes from unchanged;
    with ``probe``, only through operators that commute with a filter on it."""
    found = _traced(rel, index, probe)
    return None if found is None else found[0]


def _traced(
    rel: algebra_pb2.Rel, index: int, probe: bool
) -> tuple[tuple[str, int], algebra_pb2.Rel] | None:
    """``trace``, with the read it ends at."""
    while tree.kind(rel) != "read":
        step = step_down(rel, index, probe)
        if step is None:
            return None
        rel, index = step
    here = unmapped(rel, index)
    column = None if here is None else _read(rel.read, here)
    return None if column is None else (column, rel)


def stored_column(plan: plan_pb2.Plan, index: int) -> str | None:
    """The stored column that output column ``index`` of a fragment's sub-plan comes from
    unchanged, through operators that commute with a filter on it (None: there is none). A
    device cuts the rows it reads by a key set on that column, before the sub-plan runs,
    instead of cutting the sub-plan's output (TPC-H Q17: lineitem's average quantity per part,
    of 200,000 parts, is wanted for 204)."""
    rel = tree.root_rel(plan)
    while tree.kind(rel) != "read":
        step = step_down(rel, index, probe=True)
        if step is None:
            return None
        rel, index = step
    here = unmapped(rel, index)
    fields = tree.read_output_fields(rel.read)
    names = rel.read.base_schema.names
    if here is None or here >= len(fields) or len(names) != len(rel.read.base_schema.struct.types):
        return None  # a nested schema numbers its names apart from its fields
    return names[fields[here]]


def _read(read: algebra_pb2.ReadRel, index: int) -> tuple[str, int] | None:
    names = tuple(read.named_table.names) if read.HasField("named_table") else ()
    fields = tree.read_output_fields(read)
    if len(names) != 1 or index >= len(fields):
        return None
    return names[0], fields[index]
