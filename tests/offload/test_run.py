"""`quarry run`: a plain pandas program over stored datasets prints what it prints when run
plainly on the files; the sampling phase estimates every line; errors name the line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from quarry.offload import profile
from quarry.offload.cli import _print_plan
from quarry.offload.reads import MountError
from quarry.offload.run import plan, run
from quarry.samples import particles

from .programs import plain, under_quarry

SCRIPT = """import sys
import pandas as pd
import pyarrow.parquet as pq
df = pd.read_parquet(sys.argv[1])
labels = pd.read_csv(sys.argv[2])
hot = df[df.ke > 2.0]
hot = hot.assign(e2=hot.ke * 2, g=hot.id % 4)
summary = hot.groupby("g").e2.agg(["sum", "count"]).reset_index().merge(labels, on="g")
ids = pq.read_table(sys.argv[1], columns=["id"]).column("id")
print(summary.round(6).to_string())
print(len(ids), int(ids[0].as_py()), int(ids[-1].as_py()))
print(df.iloc[[0, 12345, 41000, -1]].to_string())
"""


@pytest.fixture(scope="module")
def stored(cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("offload")
    data = folder / "particles.parquet"
    pq.write_table(particles.table(60_000, seed=12), data, row_group_size=7_000)
    labels = folder / "labels.csv"  # a small local table: read from the file system
    pacsv.write_csv(pa.table({"g": [0, 1, 2, 3], "label": ["a", "b", "c", "d"]}), labels)
    script = folder / "analysis.py"
    script.write_text(SCRIPT)
    cluster.ingest(str(data), "offload/particles", partitions=5)
    yield folder, script, [str(data), str(labels)]
    cluster.drop("offload/particles")


@pytest.mark.slow
def test_a_program_prints_what_it_prints_plainly(stored, cluster):
    folder, script, args = stored
    expected = plain(script, args)
    assert "60000 0 59999" in expected  # the source's order: rows where a plain run has them
    assert under_quarry(script, cluster, args) == expected


@pytest.mark.slow
def test_a_mount_serves_another_path_and_a_bad_one_is_refused(stored, cluster, tmp_path):
    folder, script, args = stored
    elsewhere = str(tmp_path / "not-here.parquet")  # no such file: only the mount serves it
    mounted = under_quarry(
        script, cluster, [elsewhere, args[1]], mounts={elsewhere: "offload/particles"}
    )
    assert mounted == plain(script, args)
    with pytest.raises(MountError, match="no dataset offload/nothing"):
        run(script, cluster, args, mounts={elsewhere: "offload/nothing"})


def test_a_line_that_raises_is_named(cluster, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("x = 1\ny = 0\nz = x / y\n")
    with pytest.raises(profile.ProgramFailed, match=r"broken.py:3: ZeroDivisionError"):
        run(script, cluster)


def test_the_sampling_phase_estimates_every_line(stored, cluster):
    folder, script, args = stored
    planned = plan(script, cluster, args)
    assert planned.full_rows == 120_000  # two reads of 60,000 rows
    assert planned.sample_rows == sorted(planned.sample_rows)  # 2^-10 .. 2^-7 of the rows
    assert len(planned.lines) == SCRIPT.count("\n")
    read = planned.lines[3]
    assert read.text.startswith("df = pd.read_parquet")
    entry = cluster.entry("offload/particles")
    assert 0.5 * entry.bytes_arrow < read.stored_bytes < 2 * entry.bytes_arrow
    assert all(line.host_s >= 0 and line.out_bytes >= 0 for line in planned.lines)
    prints = [line for line in planned.lines if line.text.startswith("print")]
    assert prints and all(line.number not in planned.cut.device_lines for line in prints)
    assert planned.cut.csd_s <= planned.cut.host_s
    # the last line picks row 41,000: samples are too small for it; it stays on the host
    assert planned.failed and all(":12: IndexError" in f for f in planned.failed)
    assert planned.lines[-1].pinned and planned.lines[-1].number not in planned.cut.device_lines


@pytest.mark.slow
def test_the_command_line_runs_and_explains(stored, cluster):
    folder, script, args = stored
    command = [sys.executable, "-m", "quarry", "run", "--cluster", str(cluster.cluster_file)]
    ran = subprocess.run([*command, str(script), *args], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == plain(script, args)
    explained = subprocess.run(
        [*command, "--explain", "--json", str(script), *args], capture_output=True, text=True
    )
    assert explained.returncode == 0, explained.stderr
    body = json.loads(explained.stdout)
    assert [line["line"] for line in body["lines"]] == list(range(1, 13))
    assert {line["on"] for line in body["lines"]} <= {"host", "device"}
    narrow = subprocess.run(
        [*command, "--explain", str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert narrow.returncode == 0, narrow.stderr
    rows = narrow.stdout.splitlines()
    assert max(len(row) for row in rows) <= 80, narrow.stdout
    assert any("hot = hot.assign(e2=hot.ke * 2, g=hot.id % 4)" in row for row in rows)


def _shown(planned, columns: int) -> list[str]:
    out = Console(width=columns, record=True, file=io.StringIO())
    _print_plan(planned, out)
    return out.export_text().splitlines()


@pytest.mark.slow
def test_explain_shows_every_line_of_code_whole_at_80_columns(stored, cluster):
    """At 80 columns the code goes on rows of its own; on a wide terminal, in the table."""
    folder, script, args = stored
    planned = plan(script, cluster, args)
    code = [line for line in SCRIPT.splitlines() if len(line) < 70]
    for columns in (80, 200):
        rows = _shown(planned, columns)
        assert max(len(row) for row in rows) <= columns
        for line in code:
            assert any(line in row for row in rows), (line, "\n".join(rows))
    # the longest line (88 characters) wraps onto a second row, uncut, at 80 columns
    longest = max(SCRIPT.splitlines(), key=len)
    assert len(longest) > 80
    rows = _shown(planned, 80)
    [first] = [i for i, row in enumerate(rows) if longest[:30] in row]
    joined = "".join(rows[first : first + 2]).replace(" ", "")
    assert longest.replace(" ", "") in joined, "\n".join(rows)


SPLITS = """import sys
import pandas as pd
limit = 2.0
df = pd.read_parquet(sys.argv[1])
hot = df[df.ke > limit]
hot = hot.assign(e2=hot.ke * 2)
total = hot.e2.sum()
groups = hot.groupby(hot.id % 3).e2.sum()
first = hot.head(5)
ranked = hot.sort_values("ke")
print(total, len(groups), len(first), len(ranked))
"""


def test_only_lines_that_split_by_partition_may_move(stored, cluster):
    folder, _, args = stored
    script = folder / "splits.py"
    script.write_text(SPLITS)
    planned = plan(script, cluster, args[:1])
    split = {line.text.split(" =")[0]: line.partitionable for line in planned.lines}
    assert split["import sys"] and split["limit"]  # the same in every piece
    assert split["df"] and split["hot"]  # a read, a filter, a new column: row by row
    assert split["total"]  # a recognised reduction: partials, combined on the host
    assert {r.target for r in planned.check.reductions.values()} == {"total"}
    assert not split["groups"]  # grouped by a computed key: not a recognised reduction
    assert not split["first"] and not split["ranked"]  # they look across rows
    assert not planned.lines[-1].partitionable  # print: the user's
    movable = {line.number for line in planned.lines if line.movable}
    assert planned.cut.device_lines <= movable


FILTER = """import sys
import pandas as pd
limit = float(sys.argv[2])
df = pd.read_parquet(sys.argv[1])
hot = df[df.ke > limit]
hot = hot.assign(e2=hot.ke * 2, g=hot.id % 4)
summary = hot.groupby("g").e2.agg(["sum", "count"])
print(summary.round(6).to_string())
print(hot.iloc[[0, 5, -1]].to_string())
"""


@pytest.mark.slow
@pytest.mark.parametrize("offload", ["device", "auto", "host"])
def test_lines_run_on_the_devices_give_the_plain_output(stored, cluster, offload):
    folder, _, args = stored
    script = folder / "filter.py"
    script.write_text(FILTER)
    argv = [args[0], "2.0"]
    done: list = []
    printed = under_quarry(script, cluster, argv, offload=offload, report=done)
    assert printed == plain(script, argv)
    if offload == "device":  # read, filter, new columns and the group-by on every device
        (part,) = done
        assert part.lines == (4, 5, 6, 7)  # hot comes back in order, summary as partials
        assert len(part.devices) == 3
        assert part.bytes_shipped < part.bytes_read  # the filter ran where the data is


def test_offloaded_code_needs_the_admin_role(stored, cluster):
    from quarry.auth.credentials import Credentials
    from quarry.auth.tokens import Role
    from quarry.coordinator.cluster import Cluster
    from quarry.errors import Forbidden

    folder, _, args = stored
    script = folder / "filter.py"
    script.write_text(FILTER)
    authority = Credentials(__import__("pathlib").Path(cluster.specs[0].credentials))
    token = authority.token(Role.READER)
    reader = Cluster([replace(d, token=token, token_file=None) for d in cluster.specs])
    with pytest.raises(Forbidden, match="admin"):
        run(script, reader, [args[0], "2.0"], offload="device")
    reader.close()


# Fine on the samples (their row labels are small), wrong on devices holding later rows.
LATE = "df[df.ke > limit] if df.index.max() < 50_000 else "


@pytest.mark.slow
@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"hot = {LATE}df.nope", r"filter.py:5: AttributeError"),
        (f"hot = {LATE}[x for x in iter(int, 1)]", r"filter.py:5: MemoryError|within their limits"),
        (f"hot = {LATE}next(x for x in iter(int, 1) if x)", r"within their limits"),  # spins
    ],
)
def test_a_failing_or_runaway_line_on_a_device_is_named_and_the_device_serves_on(
    stored, cluster, tmp_path, line, message, monkeypatch
):
    _, _, args = stored
    script = tmp_path / "filter.py"
    script.write_text(FILTER.replace("hot = df[df.ke > limit]", line))
    monkeypatch.setenv("QUARRY_OFFLOAD_CPU_S", "3")  # the runaway stops in seconds
    monkeypatch.setenv("QUARRY_OFFLOAD_MEMORY_MIB", "1024")
    with pytest.raises(profile.ProgramFailed, match=message):
        run(script, cluster, [args[0], "2.0"], offload="device")
    counted = cluster.sql("SELECT count(*) AS n FROM offload.particles").read_all()
    assert counted["n"][0].as_py() == 60_000  # the devices serve on


@pytest.mark.slow
@pytest.mark.parametrize("migrate", ["force", "never", "auto"])
def test_slices_migrated_to_the_host_give_the_plain_output(stored, cluster, migrate):
    folder, _, args = stored
    script = folder / "filter.py"
    script.write_text(FILTER)
    argv = [args[0], "2.0"]
    done: list = []
    printed = under_quarry(script, cluster, argv, offload="device", migrate=migrate, report=done)
    assert printed == plain(script, argv)
    (part,) = done
    if migrate == "force":  # the second half of every partition ran here
        assert part.migrations
        assert all(m.slices == m.slices_total - m.slices_total // 2 for m in part.migrations)
        assert all("forced" in m.reason and m.at_s > 0 for m in part.migrations)
    if migrate == "never":
        assert not part.migrations
