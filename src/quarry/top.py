"""`quarry top`: the cluster's devices live, refreshed in place (Ceph's `ceph -s`, `top`).

It asks what `quarry status` asks (each device's ``stats``), every ``interval_s``: counts since
each device started (bytes through its links, its work counters, refused as busy), so a rate is
the difference of two answers over the time between them. A device that restarted in between
counts from zero again: its rate is shown from its new counts alone, never negative. Under the
table, why the slices pushed back meanwhile went back, per device (``PushBack``).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from quarry.cli_common import human_bytes, pushed_back_words
from quarry.coordinator.cluster import Cluster
from quarry.coordinator.membership.listing import DeviceStatus
from quarry.protocol.control import StatsReply

INTERVAL_S_MIN = 0.2  # a device answers stats in milliseconds; faster is noise
QUIT_KEYS = ("q", "Q")


@dataclass(frozen=True)
class Sample:
    """Every device's answer at one moment (``time.monotonic()``)."""

    at_s: float
    rows: tuple[DeviceStatus, ...]


def sample(cluster: Cluster) -> Sample:
    return Sample(time.monotonic(), tuple(cluster.status()))


def table(before: Sample, now: Sample) -> Table:
    """One row per device: what it does now, and its rates between the two samples. Narrow
    enough for 80 columns: no vertical rules, short headers (docs/operations.md says each)."""
    elapsed_s = max(now.at_s - before.at_s, 1e-9)
    earlier = {row.device: row.stats for row in before.rows}
    shown = Table(
        title=f"quarry top: rates over {elapsed_s:.1f} s; q or Ctrl-C ends it",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=0,  # the box puts one space between columns: 80 of them hold it all
    )
    shown.add_column("device", no_wrap=True)
    for column in ("work", "queued", "read/s", "sent/s", "pushed", "busy/s", "free"):
        shown.add_column(column, justify="right", no_wrap=True)
    why: list[str] = []
    for row in now.rows:
        stats = row.stats
        if stats is None:
            shown.add_row(row.device, "[red]down[/red]", *["-"] * 6)
            continue
        was = _since(earlier.get(row.device) or StatsReply(keys=0, file_bytes=0), stats)
        shown.add_row(row.device, *_figures(stats, was, elapsed_s))
        now_by, was_by = stats.work.pushed_back_by(), was.work.pushed_back_by()
        by = {reason: now_by.get(reason, 0) - was_by.get(reason, 0) for reason in now_by}
        if any(by.values()):
            why.append(f"{row.device} {pushed_back_words(by)}")
    if why:  # what the "pushed" column's slices went back for, in the interval
        shown.caption = "why: " + "; ".join(why)
        shown.caption_justify = "left"
    return shown


def _since(before: StatsReply, now: StatsReply) -> StatsReply:
    """The earlier answer, or none if the device restarted since (its counts fell)."""
    restarted = now.read_bytes < before.read_bytes or now.admitted < before.admitted
    return StatsReply(keys=0, file_bytes=0) if restarted else before


def _figures(now: StatsReply, before: StatsReply, elapsed_s: float) -> list[str]:
    scanned = now.work.slices_scanned - before.work.slices_scanned
    pushed = now.work.slices_pushed_back - before.work.slices_pushed_back
    return [
        f"{now.running} of {now.exchanges_max}",
        human_bytes(now.queued_bytes),
        human_bytes((now.read_bytes - before.read_bytes) / elapsed_s),  # per second: its header
        human_bytes((now.shipped_bytes - before.shipped_bytes) / elapsed_s),
        f"{pushed / scanned:.0%}" if scanned else "-",
        f"{(now.refused - before.refused) / elapsed_s:.1f}",
        human_bytes(now.free_bytes),
    ]


def once(cluster: Cluster, console: Console, interval_s: float) -> None:
    """A snapshot: two samples ``interval_s`` apart, their table printed once."""
    before = sample(cluster)
    time.sleep(interval_s)
    console.print(table(before, sample(cluster)))


def live(cluster: Cluster, console: Console, interval_s: float) -> None:
    """The table refreshed in place every ``interval_s`` until q (or Ctrl-C)."""
    previous = sample(cluster)
    with _keys() as pressed, Live(console=console, auto_refresh=False) as view:
        view.update(table(previous, previous), refresh=True)
        while True:
            key = pressed(interval_s)
            if key is not None and key in QUIT_KEYS:
                return
            current = sample(cluster)
            view.update(table(previous, current), refresh=True)
            previous = current


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """A wait that a key ends early: the key, or None when ``timeout_s`` passed. The terminal
    hands keys over one at a time (cbreak) meanwhile; Ctrl-C still interrupts. Without a
    terminal (a pipe, a test) it only waits."""
    if not sys.stdin.isatty():

        def wait(timeout_s: float) -> str | None:
            time.sleep(timeout_s)
            return None

        yield wait
        return
    import termios
    import tty

    descriptor = sys.stdin.fileno()
    saved = termios.tcgetattr(descriptor)
    tty.setcbreak(descriptor)
    try:

        def read(timeout_s: float) -> str | None:
            ready, _, _ = select.select([descriptor], [], [], timeout_s)
            return os.read(descriptor, 1).decode(errors="replace") if ready else None

        yield read
    finally:
        termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)
