"""Every QUARRY_* variable is declared once (quarry.settings): a bad value is one clear error
naming it, from the module and from a command; bounds hold; unset, each means what it always
meant; and docs/configuration.md lists exactly the declared variables."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quarry import settings
from quarry.errors import QuarryError, SettingError
from quarry.settings import REGISTRY, Setting

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"\bQUARRY_[A-Z][A-Z0-9_]*\b")
NUMBERS = [s for s in REGISTRY.values() if s.kind in (int, float)]


def _ids(items: list[Setting]) -> list[str]:
    return [s.name for s in items]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """Every test starts from an environment with none of the variables set."""
    for name in REGISTRY:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("setting", NUMBERS, ids=_ids(NUMBERS))
def test_a_value_that_is_not_a_number_is_one_error_naming_the_variable(setting, monkeypatch):
    monkeypatch.setenv(setting.name, "lots")
    with pytest.raises(SettingError) as caught:
        setting.get()
    message = str(caught.value)
    assert isinstance(caught.value, QuarryError) and caught.value.code == "setting_error"
    assert message.startswith(f"{setting.name}='lots' is not allowed: it must be a ")
    assert setting.allowed_text in message and f"unset: {setting.default_text}" in message
    assert "\n" not in message


@pytest.mark.parametrize("setting", NUMBERS, ids=_ids(NUMBERS))
def test_bounds_are_enforced(setting, monkeypatch):
    def value(text: str) -> object:
        monkeypatch.setenv(setting.name, text)
        return setting.get()

    if setting.lower is not None:
        below = setting.lower if setting.lower_open else setting.lower - 1
        with pytest.raises(SettingError, match=re.escape(setting.bounds_text)):
            value(str(setting.kind(below)))
        if not setting.lower_open:
            assert value(str(setting.kind(setting.lower))) == setting.lower
    if setting.upper is not None:
        with pytest.raises(SettingError, match=setting.name):
            value(str(setting.kind(setting.upper + 1)))
        assert value(str(setting.kind(setting.upper))) == setting.upper
    if setting.kind is int:
        with pytest.raises(SettingError, match="whole number"):
            value("1.5")
    else:
        for text in ("inf", "nan", "-inf"):
            with pytest.raises(SettingError, match=setting.name):
                value(text)


def test_the_host_s_turns_reject_zero_instead_of_raising_it_to_one(monkeypatch):
    from quarry.coordinator.query.host_admission import Workload

    monkeypatch.setenv("QUARRY_HOST_QUERIES_MAX", "0")
    with pytest.raises(SettingError, match=r"QUARRY_HOST_QUERIES_MAX='0' .* at least 1"):
        Workload()
    monkeypatch.setenv("QUARRY_HOST_QUERIES_MAX", " 3 ")  # spaces around a value are fine
    assert Workload().slots == 3


@pytest.mark.parametrize("setting", list(REGISTRY.values()), ids=list(REGISTRY))
def test_unset_or_empty_is_the_default(setting, monkeypatch):
    assert setting.get() == setting.default
    monkeypatch.setenv(setting.name, "  ")
    assert setting.get() == setting.default


def test_defaults_are_what_the_code_always_used(monkeypatch):
    from quarry.cli_common import DEFAULT_DATA, cluster_file
    from quarry.coordinator.ingest.atomic import lease_seconds
    from quarry.coordinator.query.host_admission import SLOTS_PER_CORE, Workload
    from quarry.device.admission import exchanges_for, queued_bytes_default
    from quarry.device.faults import hit
    from quarry.offload.cut import limits
    from quarry.plan.memory import SUPER_PLAN_MEMORY_BYTES_MAX, default_memory_bytes_max

    workload = Workload()
    assert workload.slots == SLOTS_PER_CORE * (os.cpu_count() or 1)
    assert (workload.short_s, workload.wait_s_max) == (0.25, 900)
    assert settings.BUSY_WAIT_S.get() == 120
    assert exchanges_for(3) == 6 and exchanges_for(1) == 4
    assert queued_bytes_default() == 256 << 20
    assert lease_seconds() == 60
    assert default_memory_bytes_max() == SUPER_PLAN_MEMORY_BYTES_MAX
    assert limits() == {"cpu_s": 600, "memory_bytes": 2 << 30, "chunk_wall_s": 600.0}
    assert cluster_file(None) == Path(DEFAULT_DATA) / "cluster.json"
    hit("dev0", "commit")  # no fault file: nothing happens (a fault would end this process)


def test_set_values_are_read_when_used_not_at_import(monkeypatch):
    from quarry.coordinator.membership.backoff import BusyCounter, retrying
    from quarry.coordinator.query.host_admission import Workload
    from quarry.device.admission import exchanges_for, queued_bytes_default
    from quarry.errors import DeviceBusy
    from quarry.offload.cut import limits

    monkeypatch.setenv("QUARRY_HOST_QUERIES_MAX", "5")
    monkeypatch.setenv("QUARRY_DEVICE_EXCHANGES_MAX", "1")
    monkeypatch.setenv("QUARRY_DEVICE_QUEUED_MIB_MAX", "0.5")
    monkeypatch.setenv("QUARRY_OFFLOAD_MEMORY_MIB", "1024")
    monkeypatch.setenv("QUARRY_BUSY_WAIT_S", "0")
    assert Workload().slots == 5
    assert exchanges_for(8) == 1
    assert queued_bytes_default() == 512 << 10
    assert limits()["memory_bytes"] == 1 << 30

    def busy() -> None:
        raise DeviceBusy("device d is busy: retry after 10 ms")

    with pytest.raises(DeviceBusy, match=r"the bound is 0 s, \$QUARRY_BUSY_WAIT_S"):
        retrying(busy, BusyCounter(), sleep=lambda _: None)


def test_the_super_plan_budget_below_its_floor_names_the_variable(monkeypatch):
    from quarry.plan.memory import MemoryBudget

    monkeypatch.setenv("QUARRY_SUPER_PLAN_MEMORY_MIB", "4")
    with pytest.raises(SettingError, match=r"QUARRY_SUPER_PLAN_MEMORY_MIB='4' .*at least 8"):
        MemoryBudget.of()
    monkeypatch.setenv("QUARRY_SUPER_PLAN_MEMORY_MIB", "64")
    assert MemoryBudget.of().bytes_max == 64 << 20


def test_defaults_shared_with_the_wire_are_the_wire_s():
    """The lease's and the offload worker's figures are also fields of messages; they agree."""
    from quarry.offload import device as offload
    from quarry.protocol import ingest

    lease = {f.name: f.metadata for f in dataclasses.fields(ingest.Renew)}["lease_s"]
    assert settings.INGEST_LEASE_S.default == ingest.LEASE_S_DEFAULT
    assert (settings.INGEST_LEASE_S.lower, settings.INGEST_LEASE_S.upper) == (
        lease["low"],
        ingest.LEASE_S_MAX,
    )
    fields = {f.name: f.metadata for f in dataclasses.fields(offload.LinesArgs)}
    assert settings.OFFLOAD_CPU_S.default == offload.CPU_S_DEFAULT
    assert settings.OFFLOAD_CPU_S.lower == fields["cpu_s"]["low"]
    assert settings.OFFLOAD_MEMORY_MIB.default << 20 == offload.MEMORY_BYTES_DEFAULT
    assert settings.OFFLOAD_MEMORY_MIB.lower * (1 << 20) == fields["memory_bytes"]["low"]
    assert settings.OFFLOAD_CHUNK_S.default == offload.CHUNK_WALL_S_DEFAULT
    assert settings.OFFLOAD_CHUNK_S.lower == fields["chunk_wall_s"]["low"]


def _quarry(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quarry", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **variables},
    )


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("QUARRY_HOST_QUERIES_MAX", "0", "a whole number of queries, at least 1"),
        ("QUARRY_HOST_QUEUE_S", "forever", "a number of seconds, 0 to 86400"),
    ],
)
def test_a_command_with_a_bad_value_fails_with_one_line_naming_it(
    tmp_path, variable, value, allowed
):
    """The error reaches a user of the command line as one red line and exit code 2, before any
    device is asked anything (the one in the cluster file is not even there)."""
    cluster = tmp_path / "cluster.json"
    device = {"name": "dev0", "address": "grpc://127.0.0.1:9"}
    cluster.write_text(json.dumps({"format": 1, "devices": [device]}))
    done = _quarry(tmp_path, "datasets", "--cluster", str(cluster), **{variable: value})
    assert done.returncode == 2, done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: {variable}={value!r} is not allowed: it must be {allowed}")


def test_the_cluster_file_comes_from_the_environment(tmp_path):
    done = _quarry(tmp_path, "datasets", QUARRY_CLUSTER=str(tmp_path / "elsewhere.json"))
    assert done.returncode == 2
    assert f"no cluster file at {tmp_path / 'elsewhere.json'}" in done.stderr


def test_the_settings_module_imports_nothing_heavy():
    """Device processes and the cost model's neighbours import it: no Arrow, no engine."""
    code = "import json, sys, quarry.settings; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout))
    heavy = {"pyarrow", "numpy", "datafusion", "pandas", "typer", "rich", "substrait"}
    assert not loaded & heavy
    assert {m for m in loaded if m.startswith("quarry")} == {
        "quarry",
        "quarry.errors",
        "quarry.settings",
    }


def test_each_setting_is_named_for_its_variable():
    for attribute, value in vars(settings).items():
        if isinstance(value, Setting):
            assert value.name == f"QUARRY_{attribute}", attribute
            assert REGISTRY[value.name] is value
            assert value.why and not value.why.endswith(".")


def _doc_rows() -> dict[str, list[str]]:
    """The table's rows by variable: type, default, unit, bounds, what and why."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = NAME.fullmatch(cells[0].strip("`$")) if line.startswith("|") else None
        if found:
            assert found.group() not in rows, f"{found.group()} is listed twice"
            rows[found.group()] = [c.strip("`") for c in cells[1:]]
    return rows


def test_the_doc_lists_exactly_the_declared_variables():
    rows = _doc_rows()
    assert sorted(rows) == sorted(REGISTRY)
    for name, (kind, default, unit, bounds, why) in rows.items():
        setting = REGISTRY[name]
        assert kind == setting.type_text, name
        assert default == setting.default_text, name
        assert unit == (setting.unit or "-"), name
        assert bounds == setting.bounds_text, name
        assert why.startswith(setting.why), f"{name}: the doc's why starts with the setting's"


def test_every_variable_named_anywhere_is_declared():
    """A variable named in the docs, the code, the tests or the benchmarks that nothing
    declares is a typo or a setting read some other way."""
    named: dict[str, set[str]] = {}
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for folder in ("src", "tests", "bench"):
        files += (ROOT / folder).rglob("*.py")
    for path in files:
        for name in NAME.findall(path.read_text()):
            named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    unknown = {name: sorted(where) for name, where in named.items() if name not in REGISTRY}
    assert unknown == {}


def test_docs_that_name_a_variable_link_the_configuration_page():
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        if path != DOC and NAME.search(text):
            assert "configuration.md" in text, f"{path.name} names a variable without the link"


def test_a_float_setting_shows_whole_numbers_plainly():
    assert settings.BUSY_WAIT_S.default_text == "120"
    assert settings.SHORT_QUERY_S.bounds_text == "0 to 86400"
    assert settings.DEVICE_QUEUED_MIB_MAX.bounds_text == "more than 0"
    assert settings.CLUSTER.bounds_text == "none" and settings.CLUSTER.allowed_text == "a path"
