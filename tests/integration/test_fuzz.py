"""A few thousand mutated inputs to every decoder and reader, and to a live device: each is
accepted or refused with a clear error; nothing crashes or hangs; the device answers right
afterwards. ``bench/fuzz.py`` runs the same at 100,000 inputs."""

from __future__ import annotations

import random

import pytest

from quarry.fuzz import live, workers
from quarry.fuzz.core import Outcomes
from quarry.samples import particles

PLAN = {
    "frames": 600,
    "substrait": 500,
    "slices": 400,
    "parquet": 300,
    "csv": 300,
    "arrow": 300,
    "mtx": 200,
    "h5ad": 30,
}
HEALTH = "SELECT count(*) AS n, sum(ke) AS ke FROM fuzzcheck.particles WHERE ke > 1"


def _no_bugs(name: str, outcomes: Outcomes) -> None:
    assert outcomes.crashes == 0, (name, outcomes.examples)
    assert outcomes.hangs == 0, (name, outcomes.examples)
    assert not outcomes.unclear, (name, outcomes.examples)


@pytest.mark.slow
def test_every_decoder_and_reader_refuses_malformed_input_clearly():
    totals = workers.run(workers.chunks(PLAN, 1_000, seed=11), workers=2)
    assert {name: o.inputs for name, o in totals.items()} == PLAN
    for name, outcomes in totals.items():
        _no_bugs(name, outcomes)
        assert sum(outcomes.clear.values()) > 0, name  # the mutations did reach the checks


def test_a_live_device_refuses_malformed_requests_and_still_answers_right(cluster):
    cluster.ingest(particles.table(20_000, seed=5), "fuzzcheck/particles")
    before = cluster.sql(HEALTH).read_all().to_pylist()
    traffic = live.everyday(cluster, "fuzzcheck/particles", HEALTH, "fuzzcheck/scratch")
    assert traffic.action and traffic.ticket and traffic.exchange and traffic.put
    target = live.on(cluster, traffic)
    rng = random.Random(7)
    try:
        for call in live.CALLS:
            outcomes = target.fuzz(call, 300, rng)
            assert outcomes.inputs == 300
            _no_bugs(call, outcomes)
    finally:
        target.close()
    assert cluster.sql(HEALTH).read_all().to_pylist() == before
    assert cluster.sql(HEALTH, pushdown="always").read_all().to_pylist() == before
    cluster.drop("fuzzcheck/particles")
