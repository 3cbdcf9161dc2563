"""Where the devices settled is where a fragment starts next time, past the model's cut only."""

from __future__ import annotations

from quarry.coordinator.dispatch.report import WorkReport
from quarry.coordinator.query.settled_cuts import Settled, ended_at
from quarry.protocol.stage import Skip, Stage
from quarry.protocol.work import Decision

KEY = (b"sub-plan", "v1")
ALL = (Stage.FULL, Stage.FILTER, Stage.RAW)


def report(*stages: Stage | Skip, mode: str = "subplan") -> WorkReport:
    decisions = [Decision(i, i + 1, stage, "why") for i, stage in enumerate(stages)]
    return WorkReport("dev0", "__quarry_fragment_0", 0, mode, decisions=decisions)


def test_a_partition_ends_at_its_last_run_or_handed_back_range():
    assert ended_at([report(Stage.FILTER, Stage.FULL, Skip.PRUNED)]) is Stage.FULL
    assert ended_at([report(Skip.CACHED)]) is None
    assert ended_at([report(Stage.FULL, mode="scan")]) is None  # the host scanned it
    assert ended_at([]) is None


def test_most_partitions_decide_and_a_tie_goes_to_the_devices():
    two_full = [report(Stage.FULL), report(Stage.FULL), report(Stage.RAW)]
    assert ended_at(two_full) is Stage.FULL
    assert ended_at([report(Stage.RAW), report(Stage.FILTER)]) is Stage.FILTER


def test_devices_that_settled_past_the_model_start_there_next_time():
    settled = Settled()
    settled.learn(KEY, Stage.FILTER, [report(Stage.FILTER, Stage.FULL)])
    assert settled.start(KEY, Stage.FILTER, ALL) is Stage.FULL
    assert settled.start(KEY, Stage.RAW, ALL) is Stage.FULL
    assert settled.start(KEY, Stage.FULL, ALL) is None  # the model already starts there
    assert settled.start(KEY, Stage.FILTER, (Stage.FILTER, Stage.RAW)) is None  # not allowed
    assert settled.start((b"other", "v1"), Stage.FILTER, ALL) is None


def test_handing_back_is_not_kept_and_forgets_what_was():
    settled = Settled()
    settled.learn(KEY, Stage.FULL, [report(Stage.FULL, Stage.RAW)])  # load: not a lesson
    assert settled.start(KEY, Stage.FULL, ALL) is None
    settled.learn(KEY, Stage.RAW, [report(Stage.RAW, Stage.FULL)])
    assert settled.start(KEY, Stage.RAW, ALL) is Stage.FULL
    settled.learn(KEY, Stage.RAW, [report(Stage.FULL, Stage.RAW)])  # ended at the model's cut
    assert settled.start(KEY, Stage.RAW, ALL) is None


def test_the_oldest_fragment_goes_first_past_the_bound():
    settled = Settled(size_max=2)
    for name in (b"a", b"b", b"c"):
        settled.learn((name, "v1"), Stage.RAW, [report(Stage.FULL)])
    assert settled.start((b"a", "v1"), Stage.RAW, ALL) is None
    assert settled.start((b"c", "v1"), Stage.RAW, ALL) is Stage.FULL


def test_queries_on_many_threads_share_it():
    from concurrent.futures import ThreadPoolExecutor

    settled = Settled(size_max=8)

    def run(i: int) -> None:
        for j in range(200):
            key = (f"{i}-{j % 12}".encode(), "v1")
            settled.learn(key, Stage.RAW, [report(Stage.FULL)])
            settled.start(key, Stage.RAW, ALL)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, range(8)))  # no error from a dict changed under an iterator
    assert len(settled._cuts) <= 8
