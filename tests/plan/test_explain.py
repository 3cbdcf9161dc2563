"""EXPLAIN: the cut in words and in JSON."""

from __future__ import annotations

import json

from quarry.plan import decompose


def test_explain_shows_the_cut(tpch) -> None:
    decomposition = decompose(tpch.queries[1], tpch.schemas)
    text = decomposition.explain()
    assert text.startswith("pushdown: always\nsuper-plan (host):")
    assert (
        "sub-plan __quarry_fragment_0 <- tpch/lineitem [full]: pushed projection, filter, "
        "partial_aggregate" in text
    )
    assert "device filter: (l_shipdate <= DATE '1998-09-02')" in text
    assert "quarry_avg_decimal" in text  # the host's merge


def test_json_is_serializable(tpch) -> None:
    for number in (1, 9, 21):
        document = decompose(tpch.queries[number], tpch.schemas).to_json()
        assert json.loads(json.dumps(document)) == document
        assert {"pushdown", "super_plan", "output_schema", "fragments"} <= set(document)
        for fragment in document["fragments"]:
            assert {
                "name",
                "dataset",
                "pushed",
                "device_stages",
                "predicates",
                "raw_schema",
                "output_schema",
                "stage_bytes",
                "plan",
            } <= set(fragment)
