"""Every ``QUARRY_*`` environment variable, declared once: its type, default, unit, bounds and
why you would set it.

quarry reads its environment in a dozen places (a device's admission, the host's turns, the
super-plan's memory, offload's limits, the cluster file). Every read goes through a `Setting`
here, so a variable has one name, one default and one bound; a bad value is one clear
`SettingError` naming the variable, the value and what is allowed; and docs/configuration.md
lists them all (tests/test_settings.py holds the doc to this registry, and
tests/test_architecture.py holds every other module to reading through it).

A value is parsed and checked each time it is read, never at import: tests set variables at run
time, and device processes get theirs from the environment they were started with. A read is
an environment lookup and an ``int()`` or ``float()``, cheap beside anything that reads one.

This module imports nothing heavy and nothing of quarry's but its errors: device processes and
the cost model's neighbours import it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from quarry.errors import SettingError

T = TypeVar("T")

KINDS = {int: "whole number", float: "number", Path: "path"}  # what a variable's text may be
# A day: a longer wait is a hang, and threading's timeouts overflow on larger ones (inf too).
DAY_S = 86_400.0


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable. ``default`` is what it means unset (or empty); None where the
    code that reads it works the default out (from the cores, the machine's memory), and
    ``unset`` then says how, for the docs and the errors. Bounds are inclusive, but for
    ``lower_open``: then the value must be above ``lower``."""

    name: str
    kind: type  # int, float or Path: how the text is parsed
    default: T
    unit: str  # what the number counts, in the plural ("seconds", "MiB"); "" for a path
    why: str  # one line: what it sets, and why you would change it
    lower: float | None = None
    upper: float | None = None
    lower_open: bool = False
    unset: str = ""

    def __post_init__(self) -> None:
        assert self.name.startswith("QUARRY_"), self.name
        assert self.kind in KINDS, f"{self.name}: parse {self.kind} as one of {list(KINDS)}"
        assert (self.default is None) == bool(self.unset), (
            f"{self.name}: say what an unset variable means exactly when the default is None"
        )
        assert self.default is None or self._allows(self.default), f"{self.name}: default"

    def get(self) -> T:
        """The variable's value from the environment now, parsed and checked; the default when
        it is unset or empty."""
        text = os.environ.get(self.name, "").strip()
        return self.parse(text) if text else self.default

    def parse(self, text: str) -> T:
        """``text`` as this variable's value, or a `SettingError` that names it."""
        try:
            value = self.kind(text)
        except ValueError:
            raise self._invalid(text) from None
        if not self._allows(value):
            raise self._invalid(text)
        return cast(T, value)

    @property
    def type_text(self) -> str:
        return KINDS[self.kind]

    @property
    def default_text(self) -> str:
        return self.unset or _shown(self.default)

    @property
    def bounds_text(self) -> str:
        lower = None if self.lower is None else _shown(self.lower)
        upper = None if self.upper is None else _shown(self.upper)
        if lower is not None and upper is not None:
            return f"{lower} to {upper}"
        if lower is not None:
            return f"more than {lower}" if self.lower_open else f"at least {lower}"
        return "none" if upper is None else f"at most {upper}"

    @property
    def allowed_text(self) -> str:
        """What a value must be, as a phrase: "a number of seconds, 0 to 86400"."""
        if self.kind is Path:
            return "a path"
        bounds = "" if self.bounds_text == "none" else f", {self.bounds_text}"
        return f"a {self.type_text} of {self.unit}{bounds}"

    def _allows(self, value: Any) -> bool:
        if self.kind is Path:
            return True
        if self.kind is float and not math.isfinite(value):
            return False
        if self.lower is not None and (
            value <= self.lower if self.lower_open else value < self.lower
        ):
            return False
        return self.upper is None or value <= self.upper

    def _invalid(self, text: str) -> SettingError:
        return SettingError(
            f"{self.name}={text!r} is not allowed: it must be {self.allowed_text} (unset: "
            f"{self.default_text}); see docs/configuration.md"
        )


def _shown(value: Any) -> str:
    """A value as the docs and the errors print it: 120 not 120.0, a path as written."""
    return f"{value:g}" if isinstance(value, float) else str(value)


# The cluster, for every command line.
CLUSTER: Setting[Path] = Setting(
    "QUARRY_CLUSTER",
    Path,
    Path(".quarry/cluster.json"),
    "",
    "The cluster file a command uses without `--cluster`: set it to use a cluster from "
    "another folder",
)

# The host: its turns for long queries, and its patience with busy devices.
BUSY_WAIT_S: Setting[float] = Setting(
    "QUARRY_BUSY_WAIT_S",
    float,
    120.0,
    "seconds",
    "How long in all a call backs off devices that answer busy before it fails with "
    "device_busy: raise it for heavy loads that should queue, lower it to fail fast",
    lower=0.0,
    upper=DAY_S,
)
SHORT_QUERY_S: Setting[float] = Setting(
    "QUARRY_SHORT_QUERY_S",
    float,
    0.25,
    "seconds",
    "A query whose shape once ran this fast skips the host's turns for long queries: raise it "
    "to let more queries straight through",
    lower=0.0,
    upper=DAY_S,
)
HOST_QUERIES_MAX: Setting[int | None] = Setting(
    "QUARRY_HOST_QUERIES_MAX",
    int,
    None,
    "queries",
    "Long queries the host runs at once (more wait their turn): lower it to keep a user's "
    "small queries fast under load, raise it for throughput",
    lower=1,
    unset="2 per core",
)
HOST_QUEUE_S: Setting[float] = Setting(
    "QUARRY_HOST_QUEUE_S",
    float,
    900.0,
    "seconds",
    "How long a long query waits for a turn on the host before it fails",
    lower=0.0,
    upper=DAY_S,
)
DEVICE_SILENCE_S: Setting[float] = Setting(
    "QUARRY_DEVICE_SILENCE_S",
    float,
    5.0,
    "seconds",
    "How long a device may send nothing at all (not even the answer to a ping) before the "
    "host declares it lost and its work fails over: raise it for links that stall, lower it "
    "to fail over sooner",
    lower=1.0,
    upper=600.0,
)

# A device: how much work it takes on at once.
DEVICE_EXCHANGES_MAX: Setting[int | None] = Setting(
    "QUARRY_DEVICE_EXCHANGES_MAX",
    int,
    None,
    "streams",
    "Streams of new work a device runs at once in each lane (more are refused busy): 1 in "
    "tests that need a busy device, more for a device with fast storage",
    lower=1,
    unset="2 per core of the device's profile, at least 4",
)
DEVICE_CACHE_MIB: Setting[int | None] = Setting(
    "QUARRY_DEVICE_CACHE_MIB",
    int,
    None,
    "MiB",
    "Memory each device keeps for decoded columns it read, so a column read again is not read, "
    "checked and decoded again (a profile may set its own; an emulated drive keeps none). 0: "
    "none",
    lower=0,
    upper=1 << 20,
    unset="an eighth of the machine's memory",
)
DEVICE_QUEUED_MIB_MAX: Setting[float] = Setting(
    "QUARRY_DEVICE_QUEUED_MIB_MAX",
    float,
    256.0,
    "MiB",
    "Output a device holds computed but not yet sent before it refuses new work: raise it "
    "for a slow link and memory to spare",
    lower=0.0,
    lower_open=True,
)

# Ingest. The bounds are the protocol's for a lease (protocol/ingest.py; a test holds them).
INGEST_LEASE_S: Setting[float] = Setting(
    "QUARRY_INGEST_LEASE_S",
    float,
    60.0,
    "seconds",
    "How long a pending partition outlives a coordinator that stopped renewing it: short in "
    "tests of a coordinator that dies mid-ingest",
    lower=0.1,
    upper=3600.0,
)

PARTITION_MIB_MIN: Setting[float] = Setting(
    "QUARRY_PARTITION_MIB_MIN",
    float,
    16.0,
    "MiB",
    "Each partition of a new table holds at least this much (up to one partition per drive), "
    "so a table under it is one partition: each partition a query reads costs its device a "
    "few ms whatever it holds. 0: a partition per 1 MiB row group the table fills",
    lower=0.0,
    upper=1 << 20,
)

# Integrity (docs/integrity.md).
SCRUB_MIB_PER_S: Setting[float] = Setting(
    "QUARRY_SCRUB_MIB_PER_S",
    float,
    100.0,
    "MiB/s",
    "How fast `quarry scrub` reads each device's slices (and copies good ones over damaged "
    "ones), so queries keep their drives: raise it for an idle cluster, lower it for a busy "
    "one; `--bandwidth` sets it for one run",
    lower=0.0,
    lower_open=True,
)

# Credentials (docs/security.md). The admin token's bounds are a token's (auth/tokens.py).
ADMIN_TOKEN_TTL_S: Setting[int] = Setting(
    "QUARRY_ADMIN_TOKEN_TTL_S",
    int,
    30 * 86_400,
    "seconds",
    "How long the admin token `quarry init` and `quarry up` write lives (they renew it once "
    "half of it has gone): it stays on the admin's machine beside the key that could mint "
    "another, so it may outlive a user's token; shorten it if that machine is shared",
    lower=60,
    upper=400 * 86_400,
)
REVOCATION_SYNC_S: Setting[float] = Setting(
    "QUARRY_REVOCATION_SYNC_S",
    float,
    30.0,
    "seconds",
    "How often a device asks its peers for a newer revocation list: a device that missed "
    "`quarry token revoke` refuses the token at most this long (and a call's 5 s) after it "
    "reaches a peer that has the list. Read when the device starts",
    lower=0.1,
    upper=3600.0,
)

# Metrics (docs/operations.md).
METRICS_PORT: Setting[int | None] = Setting(
    "QUARRY_METRICS_PORT",
    int,
    None,
    "port",
    "Devices and storage servers that `quarry up` (or `quarry.local`) starts serve Prometheus "
    "metrics from this port on, one port each in the order they start (0: any free port, "
    "named in each one's log): set it to scrape a local cluster",
    lower=0,
    upper=65_535,
    unset="no metrics",
)

# Traces (tracing.py, docs/operations.md).
TRACE_FILE: Setting[Path | None] = Setting(
    "QUARRY_TRACE_FILE",
    Path,
    None,
    "",
    "Every quarry process started with it (a query's host, its devices and storage servers) "
    "appends the spans of each query it takes part in to this file, one JSON line a span: set "
    "it to see a query's trace across processes without a collector",
    unset="no trace file (OTLP if OTEL_EXPORTER_OTLP_ENDPOINT is set, else no traces)",
)

# Moves (coordinator/admin/rebalance.py): a device a partition moved away from.
MOVED_KEEP_S: Setting[float] = Setting(
    "QUARRY_MOVED_KEEP_S",
    float,
    600.0,
    "seconds",
    "How long a device keeps the rows of a partition moved away from it, for queries that "
    "planned before the move: raise it above your longest query, lower it to free space sooner",
    lower=0.0,
    upper=DAY_S,
)

# The super-plan's host memory (plan/memory.py).
SUPER_PLAN_MEMORY_MIB: Setting[int | None] = Setting(
    "QUARRY_SUPER_PLAN_MEMORY_MIB",
    int,
    None,
    "MiB",
    "The host memory one query's super-plan may use before it spills, in the process that "
    "runs the query: raise it for large joins and sorts",
    lower=8,  # below this a spilled sort cannot even merge its runs
    unset="a 16th of the machine's memory (512 MiB to 4 GiB) less 128 MiB",
)

# Offload's worker processes. The defaults and lower bounds are the offload unit's
# (offload/device.py; a test holds them).
OFFLOAD_CPU_S: Setting[int] = Setting(
    "QUARRY_OFFLOAD_CPU_S",
    int,
    600,
    "seconds",
    "CPU time an offload worker may use before it is stopped (a runaway line): lower it to "
    "stop runaways sooner",
    lower=1,
)
OFFLOAD_MEMORY_MIB: Setting[int] = Setting(
    "QUARRY_OFFLOAD_MEMORY_MIB",
    int,
    2048,
    "MiB",
    "Memory an offload worker may map (RLIMIT_AS): raise it for programs that hold large "
    "values on the devices",
    lower=1,
)
OFFLOAD_CHUNK_S: Setting[float] = Setting(
    "QUARRY_OFFLOAD_CHUNK_S",
    float,
    600.0,
    "seconds",
    "Wall time one chunk of an offloaded block may take before its worker is killed",
    lower=0.1,
    upper=DAY_S,
)

QUARANTINE_S: Setting[float] = Setting(
    "QUARRY_QUARANTINE_S",
    float,
    3600.0,
    "seconds",
    "How long a device keeps a sub-plan shape whose stage failed there in quarantine (the host "
    "runs it meanwhile); `quarry quarantine clear` lifts it sooner",
    lower=0.1,
    upper=7 * DAY_S,
)
STAGE_S_MAX: Setting[float] = Setting(
    "QUARRY_STAGE_S_MAX",
    float,
    300.0,
    "seconds",
    "A chunk's stage that runs longer than this on a device has its sub-plan shape "
    "quarantined there (its answer still counts): a runaway plan goes to the host next time",
    lower=0.01,
    upper=DAY_S,
)

# Tests.
FAULT_FILE: Setting[Path | None] = Setting(
    "QUARRY_FAULT_FILE",
    Path,
    None,
    "",
    "Tests only: a file a device reads at each fault point; `<device>:<point>` in it makes "
    "that device fail there: crash (prepare, commit) or raise as its engine would (stage) "
    "(device/faults.py)",
    unset="no faults",
)
PROPERTY_EXAMPLES: Setting[int | None] = Setting(
    "QUARRY_PROPERTY_EXAMPLES",
    int,
    None,
    "examples",
    "Tests only: examples each property test tries; raise it for a bug hunt",
    lower=1,
    unset="150 in the plan's property tests, 5 in offload's",
)

# Every setting above, by name: gathered, not listed, so a new one cannot be left out.
REGISTRY: dict[str, Setting[Any]] = {
    value.name: value for value in list(globals().values()) if isinstance(value, Setting)
}
