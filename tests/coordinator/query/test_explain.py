"""EXPLAIN as records: the JSON users have read all along, with sections shown only when they
hold something (the rules of EXPLAIN VERBOSE among them)."""

from __future__ import annotations

from quarry.coordinator.dispatch.report import WorkReport
from quarry.coordinator.query.explain import Explain, HostTurn, JoinFilterShown, analyze
from quarry.coordinator.query.timing import QueryTime, Span
from quarry.plan.explain import Column, PlanExplain, RuleFired
from quarry.protocol.counters import COUNTERS, WorkCounters
from quarry.pushdown import Pushdown

CUT = PlanExplain(
    pushdown=Pushdown.ALWAYS,
    super_plan="TableScan: f",
    super_plan_passthrough="f",
    output_schema=(Column("n", "int64"),),
    fragments=(),
)
KEYS = ["query", "pushdown", "super_plan", "super_plan_passthrough", "output_schema", "fragments"]


def _time() -> QueryTime:
    span = Span(0.5, 0.25)
    return QueryTime(1.0, 0.5, *([span] * 10), streams=2)


def test_plain_explain_is_the_cut_and_its_text():
    explained = Explain(query="SELECT 1", cut=CUT, plan="text", join_filters=())
    body = explained.to_json()
    assert list(body) == [*KEYS, "plan", "join_filters"]
    assert body["pushdown"] == "always" and explained.pushdown is Pushdown.ALWAYS
    assert body["output_schema"] == [{"name": "n", "type": "int64"}]


def test_rules_and_analyze_show_when_there_are_some():
    report = WorkReport("dev0", "f", 0, "subplan")
    report.count(**{name: 1 for name in COUNTERS})
    explained = Explain(
        query="SELECT 1",
        cut=CUT,
        plan="text",
        join_filters=(JoinFilterShown("f.k IN g.k", "sent: 3 keys"), JoinFilterShown("h.k IN g.k")),
        rules=(RuleFired("push_filter", "after"),),
        analyze=analyze([report], 0.1, 1.0, 5, _time(), host_turn=HostTurn(False, 0.0)),
    )
    body = explained.to_json()
    assert list(body) == [*KEYS, "plan", "join_filters", "rules", "analyze"]
    assert body["rules"] == [{"rule": "push_filter", "plan": "after"}]
    assert body["join_filters"] == [
        {"filter": "f.k IN g.k", "outcome": "sent: 3 keys"},
        {"filter": "h.k IN g.k"},
    ]
    analyzed = body["analyze"]
    assert list(analyzed) == [
        "devices",
        "partitions",
        "bytes_shipped",
        "bytes_read",
        "bytes_cached",
        "host_cpu_s",
        "host_decode_s",
        "wall_s",
        "rows",
        "host_turn",
        "time",
    ]
    (device,) = analyzed["devices"]
    assert device["device"] == "dev0" and device["partitions"] == 1 and device["fallbacks"] == []
    assert {name: device[name] for name in COUNTERS} == WorkCounters(
        **{name: 1 for name in COUNTERS}
    ).to_json()
    assert analyzed["time"]["planning"] == {"wall_s": 0.5, "cpu_s": 0.25}
    assert analyzed["partitions"][0]["fragment"] == "f"
