"""run_super in a bounded host memory: spooling, spilling, cleanup, concurrency, clear errors."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from quarry.errors import HostMemoryExceeded, QuarryError, QueryError, SettingError
from quarry.plan import decompose, run_stage, run_super, superplan
from quarry.plan.memory import MemoryBudget, memory_summary
from quarry.plan.superplan import SortMergeRerun
from quarry.settings import SUPER_PLAN_MEMORY_MIB

from .harness import assert_same_rows

MIB = 1024 * 1024
BUDGET_BYTES = 16 * MIB  # 4 MiB of spool in memory, a 12 MiB pool: far less than the data
T_ROWS = 1_000_000  # 4 columns of 8 bytes: 32 MB
U_ROWS = 2_000
BATCH_ROWS = 10_000
LOCKSTEP_WAIT_S = 10.0
ROWS_COMPARED_BY_ROW_MAX = 50_000  # beyond, answers are compared as columns (row checks are slow)


def _table(rows: int, groups: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "g": rng.integers(0, groups, rows),
            "ke": rng.lognormal(0.0, 1.0, rows),
            "x": rng.uniform(0.0, 100.0, rows),
        }
    )


@pytest.fixture(scope="module")
def data() -> dict[str, pa.Table]:
    t = _table(T_ROWS, 20_000, seed=1)
    u = pa.table({"g": np.arange(U_ROWS, dtype=np.int64), "w": np.arange(U_ROWS) * 0.5})
    return {"test/t": t, "test/u": u}


def _schemas(data: dict[str, pa.Table]) -> dict[str, pa.Schema]:
    return {name: table.schema for name, table in data.items()}


def _expected(data: dict[str, pa.Table], sql: str) -> pa.Table:
    connection = duckdb.connect()
    for name, table in data.items():
        connection.register(name.split("/")[1], table)
    return connection.execute(sql).fetch_arrow_table()


def _device_stream(stage: bytes, table: pa.Table) -> Iterator[pa.RecordBatch]:
    """What the devices ship for one fragment: its full stage over each slice, as it runs."""
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        yield from run_stage(stage, table.schema, [batch])


def _outputs(decomposition, data) -> dict[str, Iterator[pa.RecordBatch]]:
    return {
        f.name: _device_stream(f.stages["full"], data[f.dataset]) for f in decomposition.fragments
    }


QUERIES = {
    "top-k": "SELECT * FROM t WHERE ke > 0.5 ORDER BY ke LIMIT 100",
    "group by": "SELECT g, sum(ke) AS s, count(*) AS n FROM t GROUP BY g",
    "order by": "SELECT id, g, ke, x FROM t WHERE ke > 0.1 ORDER BY ke",
    "join": "SELECT t.g, count(*) AS n, sum(u.w) AS w FROM t JOIN u ON t.g = u.g GROUP BY t.g",
}


@pytest.mark.slow
@pytest.mark.parametrize("pushdown", ["never", "always"])
@pytest.mark.parametrize("name", list(QUERIES))
def test_answers_in_a_tiny_budget(data, tmp_path: Path, name: str, pushdown: str) -> None:
    sql = QUERIES[name]
    decomposition = decompose(sql, _schemas(data), pushdown=pushdown)
    reader = run_super(
        decomposition, _outputs(decomposition, data), BUDGET_BYTES, temp_directory=tmp_path
    )
    first = reader.read_next_batch()
    spooled = list(tmp_path.rglob("*.arrow"))
    spilled = [p for p in tmp_path.rglob("datafusion-*/*") if p.is_file()]
    rest = reader.read_all()
    answer = pa.Table.from_batches([first, *rest.to_batches()], schema=reader.schema)
    expected = _expected(data, sql)
    if answer.num_rows > ROWS_COMPARED_BY_ROW_MAX:  # ordered by unique floats: column by column
        assert answer.column_names == expected.column_names
        for column in expected.column_names:
            assert np.array_equal(answer[column].to_numpy(), expected[column].to_numpy()), column
    else:
        assert_same_rows(
            answer, expected, ordered="ORDER BY" in sql, float_absolute=1e-6, context=name
        )
    if pushdown == "never":  # raw rows: far more than the spool keeps in memory
        assert spooled, "fragment output beyond the spool's memory share goes to disk"
    if name == "order by":  # 32 MB sorted in a 12 MiB pool: it can only have spilled
        assert spilled, "the sort spilled to the spool directory"
    assert list(tmp_path.iterdir()) == [], "the spool is removed once the reader is exhausted"


def _query(data, sql: str, pushdown: str = "never"):
    decomposition = decompose(sql, _schemas(data), pushdown=pushdown)
    return decomposition, _outputs(decomposition, data)


def test_spool_removed_when_the_reader_is_dropped_early(data, tmp_path: Path) -> None:
    decomposition, outputs = _query(data, QUERIES["order by"])
    reader = run_super(decomposition, outputs, BUDGET_BYTES, temp_directory=tmp_path)
    reader.read_next_batch()
    assert list(tmp_path.rglob("*.arrow"))
    reader.close()  # pyarrow keeps the iterator of a reader made from batches until it goes
    del reader
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_spool_removed_and_producers_stopped_when_a_producer_raises(data, tmp_path: Path) -> None:
    decomposition, outputs = _query(data, QUERIES["join"])
    t_fragment, u_fragment = decomposition.fragments
    stopped = threading.Event()

    def failing() -> Iterator[pa.RecordBatch]:
        stream = _device_stream(t_fragment.stages["full"], data["test/t"])
        for _ in range(5):
            yield next(stream)
        raise RuntimeError("device dev1 died mid-stream")

    def endless() -> Iterator[pa.RecordBatch]:
        batch = next(_device_stream(u_fragment.stages["full"], data["test/u"]))
        try:
            while True:  # ends only when the reader stops it
                yield batch
        finally:
            stopped.set()

    outputs = {t_fragment.name: failing(), u_fragment.name: endless()}
    reader = run_super(decomposition, outputs, BUDGET_BYTES, temp_directory=tmp_path)
    with pytest.raises(RuntimeError, match="dev1 died"):
        reader.read_all()
    assert stopped.is_set(), "the other fragment's producer was stopped"
    assert list(tmp_path.iterdir()) == []


class Lockstep:
    """Two producers, each allowed at most `ahead` batches more than the other has given.

    A reader that took one fragment to its end before starting the other would leave the
    first producer waiting forever, as a device blocked on a full queue would.
    """

    def __init__(self, ahead: int) -> None:
        self.ahead = ahead
        self.given = [0, 0]
        self.done = [False, False]
        self.condition = threading.Condition()

    def produce(self, side: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        other = 1 - side
        for batch in batches:
            with self.condition:
                may_go = self.condition.wait_for(
                    lambda: self.done[other] or self.given[side] - self.given[other] < self.ahead,
                    timeout=LOCKSTEP_WAIT_S,
                )
                if not may_go:
                    raise TimeoutError(f"producer {side} waited {LOCKSTEP_WAIT_S} s: deadlock")
                self.given[side] += 1
                self.condition.notify_all()
            yield batch
        with self.condition:
            self.done[side] = True
            self.condition.notify_all()


@pytest.mark.timeout(60)
def test_two_bounded_producers_are_read_at_once(data, tmp_path: Path) -> None:
    sql = "SELECT g, count(*) AS n FROM (SELECT g FROM t UNION ALL SELECT g FROM u) GROUP BY g"
    decomposition, outputs = _query(data, sql)
    assert len(decomposition.fragments) == 2
    lockstep = Lockstep(ahead=2)
    outputs = {
        name: lockstep.produce(side, stream) for side, (name, stream) in enumerate(outputs.items())
    }
    answer = run_super(decomposition, outputs, BUDGET_BYTES, temp_directory=tmp_path).read_all()
    assert_same_rows(answer, _expected(data, sql), ordered=False)
    assert list(tmp_path.iterdir()) == []


def test_a_join_over_budget_runs_again_as_a_sort_merge_join(
    data, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the run again spills (the OS's)
    sql = "SELECT a.id, b.ke FROM t AS a JOIN t AS b ON a.id = b.id"
    decomposition, outputs = _query(data, sql)
    reruns: list[SortMergeRerun] = []
    reader = run_super(
        decomposition, outputs, BUDGET_BYTES, temp_directory=tmp_path, reran=reruns.append
    )
    first = reader.read_next_batch()
    spilled = [path for path in tmp_path.glob(".tmp*/*") if path.is_file()]
    rest = reader.read_all()
    answer = pa.Table.from_batches([first, *rest.to_batches()], schema=reader.schema)
    answer = answer.sort_by("id")
    assert spilled, "the sort-merge join's sorts spilled (to DataFusion's own directory)"
    assert [rerun.consumer for rerun in reruns] == ["HashJoinInput"], "run again once"
    assert "ran again with sort-merge joins" in reruns[0].describe()
    expected = _expected(data, sql).sort_by("id")
    assert answer.num_rows == expected.num_rows == T_ROWS
    for column in expected.column_names:  # a million rows: compared as columns
        assert np.array_equal(answer[column].to_numpy(), expected[column].to_numpy()), column
    del reader
    gc.collect()
    assert list(tmp_path.iterdir()) == []


WIDE_ROW_BYTES = 4 * MIB  # more than a sort's share of the 12 MiB pool: no sort can take one


def test_a_join_that_does_not_fit_even_as_a_sort_merge_join_is_one_clear_error(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    wide = {"test/w": pa.table({"k": np.arange(8), "payload": ["x" * WIDE_ROW_BYTES] * 8})}
    sql = "SELECT a.k, a.payload, b.payload AS again FROM w AS a JOIN w AS b ON a.k = b.k"
    decomposition = decompose(sql, _schemas(wide), pushdown="never")
    reruns: list[SortMergeRerun] = []
    reader = run_super(
        decomposition,
        _outputs(decomposition, wide),
        BUDGET_BYTES,
        temp_directory=tmp_path,
        reran=reruns.append,
    )
    with pytest.raises(HostMemoryExceeded) as caught:
        reader.read_all()
    message = str(caught.value)
    assert isinstance(caught.value, QuarryError)
    assert len(reruns) == 1, "one run again, no more"
    assert "budget of 16 MiB" in message
    assert "not even run again as a sort-merge join that spills" in message
    assert f"{SUPER_PLAN_MEMORY_MIB.name}=" in message
    assert "DataFusion error" not in message and "Traceback" not in message
    del reader
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_a_cross_join_over_budget_is_one_clear_error(data, tmp_path: Path) -> None:
    sql = "SELECT max(a.x + a.ke + a.id + b.x) AS m FROM t AS a CROSS JOIN t AS b"
    decomposition, outputs = _query(data, sql)
    reruns: list[SortMergeRerun] = []
    reader = run_super(
        decomposition, outputs, BUDGET_BYTES, temp_directory=tmp_path, reran=reruns.append
    )
    with pytest.raises(HostMemoryExceeded) as caught:
        reader.read_all()
    message = str(caught.value)
    assert reruns == [], "a cross join has no sort-merge form to run again as"
    assert "budget of 16 MiB" in message and "join's build side" in message
    assert f"{SUPER_PLAN_MEMORY_MIB.name}=" in message
    assert "DataFusion error" not in message and "Traceback" not in message
    del reader
    gc.collect()
    assert list(tmp_path.iterdir()) == []


OUT_OF_MEMORY_IN_A_HASH_JOIN = (
    "DataFusion error: Resources exhausted: Failed to allocate additional 5.7 MB for "
    "HashJoinInput[1] with 4.9 MB already allocated for this reservation - 2.4 MB remain "
    "available for the total memory pool: fair(pool_size: 12.0 MB)"
)


def test_no_run_again_once_rows_are_out(data, tmp_path: Path, monkeypatch) -> None:
    """A hash join may run out after rows came out (one partition's build side fits and its
    rows flow while another's does not); when, depends on timing, so the run's failure is
    made here: after its first batch."""
    executed = superplan._execute

    def first_batch_then_out_of_memory(*args, **kwargs):
        yield next(executed(*args, **kwargs))
        raise Exception(OUT_OF_MEMORY_IN_A_HASH_JOIN)

    monkeypatch.setattr(superplan, "_execute", first_batch_then_out_of_memory)
    decomposition, outputs = _query(data, QUERIES["join"])
    reruns: list[SortMergeRerun] = []
    reader = run_super(
        decomposition, outputs, BUDGET_BYTES, temp_directory=tmp_path, reran=reruns.append
    )
    first = reader.read_next_batch()
    assert first.num_rows > 0
    with pytest.raises(HostMemoryExceeded, match="join's build side"):
        reader.read_next_batch()
    assert reruns == [], "rows were out: a run again would give them twice"
    del reader
    gc.collect()
    assert list(tmp_path.iterdir()) == []


EXPLAINED = {
    "top-k": ["top-k keeps 100 rows"],
    "order by": ["sort spills beyond the budget"],
    "join": ["a join that does not fit runs again as a sort-merge join that spills"],
}


@pytest.mark.parametrize("name", list(EXPLAINED))
def test_explain_says_how_the_host_holds_data(data, name: str) -> None:
    text = decompose(QUERIES[name], _schemas(data)).explain()
    line = text.splitlines()[1]
    spool_mib = MemoryBudget.of().spool_memory_bytes_max // MIB
    assert line.startswith(
        f"super-plan (host): streams fragments into a spool of at most {spool_mib} MiB"
    )
    assert "the rest on disk" in line
    for words in EXPLAINED[name]:
        assert words in line


def test_explain_tells_joins_with_no_sort_merge_form(data) -> None:
    cross = "SELECT max(a.x + b.x) AS m FROM t AS a CROSS JOIN t AS b"
    theta = "SELECT a.id FROM t AS a JOIN u ON a.x < u.w"
    for sql in (cross, theta):
        line = decompose(sql, _schemas(data)).explain().splitlines()[1]
        assert "a join on no equal keys may need its build side to fit the budget" in line
        assert "sort-merge" not in line


def test_explain_tells_partials_from_raw_rows(data) -> None:
    sql = QUERIES["group by"]
    always = decompose(sql, _schemas(data), pushdown="always").explain().splitlines()[1]
    never = decompose(sql, _schemas(data), pushdown="never").explain().splitlines()[1]
    assert "aggregates partials" in always
    assert "aggregate spills beyond the budget" in never


def test_a_query_holds_a_share_of_the_machine_between_bounds() -> None:
    """Four long queries at once hold a quarter of the machine; a small machine still gets
    enough for a spilled sort to merge, a large one no more than one query can use."""
    from quarry.plan.memory import query_host_memory_bytes

    gib = 1024 * MIB
    assert query_host_memory_bytes(24 * gib) == 1536 * MIB
    assert query_host_memory_bytes(2 * gib) == 512 * MIB
    assert query_host_memory_bytes(0) == 512 * MIB
    assert query_host_memory_bytes(1024 * gib) == 4 * gib


def test_the_budget_comes_from_the_environment(data, monkeypatch) -> None:
    monkeypatch.setenv(SUPER_PLAN_MEMORY_MIB.name, "64")
    decomposition = decompose(QUERIES["top-k"], _schemas(data))
    assert MemoryBudget.of().bytes_max == 64 * MIB
    assert "spool of at most 16 MiB in memory" in memory_summary(decomposition)
    assert "48 MiB spill pool" in memory_summary(decomposition)
    monkeypatch.setenv(SUPER_PLAN_MEMORY_MIB.name, "lots")
    with pytest.raises(SettingError, match="QUARRY_SUPER_PLAN_MEMORY_MIB='lots'.*whole number"):
        run_super(decomposition, _outputs(decomposition, data))
    monkeypatch.delenv(SUPER_PLAN_MEMORY_MIB.name)
    with pytest.raises(QueryError, match="at least 8 MiB"):
        run_super(decomposition, _outputs(decomposition, data), memory_bytes_max=MIB)
