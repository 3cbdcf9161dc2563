"""Algorithm 1 of ActivePy (§III.B): which lines run on the devices.

Start with every line on the host, ``T_csd = T_host``. Walk the lines in order; for each, the
program's time if it moved to the devices: its host time replaced by its device time, and its
data priced on the link (Eq. 1's terms, ``cost.eq1``). The paper prices a moved line's input
(``∓ Din/BW``, by where the line before it runs) and its output (``+ Dout/BW``); that assumes
each line reads only the one before it. Real programs read a frame in many lines (four
reductions of one frame would each save its bytes again, and the sum goes negative), so the
time of a cut is summed over the program's data flow instead (``time_of``): a value crosses the
link once when it is made on one side and read on the other, and stored data crosses when a
host line reads it. For a chain of lines the two sums are the same.

One departure, on purpose: the paper moves one line at a time, and a line that reads data
outputs as much as it read, so on its own it never pays (it saves shipping its input and ships
its output instead); a pandas program that reads in one line and reduces in the next would
never move. So from each line the walk also prices the runs of lines that start there (the same
sum, line after line) and moves the best run when it beats the time so far. A run of one line
is the paper's step. A line that prints or writes files is the user's, and a line that does
not give, per partition and concatenated, what it gives on the whole (``partitions.py``) looks
across partitions: both stay on the host and end any run. A recognised reduction may move, as
partials the host combines; what it binds exists only once combined, on the host, so a line
that reads it ends the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from quarry.cost.eq1 import transfer_s
from quarry.offload.estimate import LineEstimate


@dataclass(frozen=True)
class Step:
    number: int
    if_device_s: float  # T with this line (and the run it starts) on the devices
    moved: bool


@dataclass
class Cut:
    host_s: float  # T_host: everything on the host, raw data over the link
    csd_s: float  # T_csd: the chosen cut
    device_lines: set[int] = field(default_factory=set)
    steps: list[Step] = field(default_factory=list)


def host_time(lines: Sequence[LineEstimate], link_bytes_per_s: float) -> float:
    """T_host: the host computes every line, and what they read from storage crosses the link."""
    return time_of(lines, set(), link_bytes_per_s)


def assign(lines: Sequence[LineEstimate], link_bytes_per_s: float) -> Cut:
    t_host = host_time(lines, link_bytes_per_s)
    cut = Cut(host_s=t_host, csd_s=t_host)
    index = 0
    while index < len(lines):
        run_end, t_run = _best_run(lines, index, cut, link_bytes_per_s)
        moved = t_run < cut.csd_s
        if not moved:
            run_end = index + 1
        for position in range(index, run_end):
            number = lines[position].number
            if moved:
                cut.device_lines.add(number)
            cut.steps.append(Step(number, t_run, moved))
        if moved:
            cut.csd_s = t_run
        index = run_end
    return cut


def time_of(
    lines: Sequence[LineEstimate], device_lines: set[int], link_bytes_per_s: float
) -> float:
    """The model's time for a cut: every line's compute where it runs, and every value that
    crosses the link (stored data read on the host; a value made on one side, read on the
    other), once."""
    t = 0.0
    crossing = 0.0
    made: dict[str, LineEstimate] = {}  # name -> the line that bound it last
    crossed: set[int] = set()  # lines whose output crossed already
    for line in lines:
        on_device = line.number in device_lines
        t += line.device_s if on_device else line.host_s
        if not on_device:
            crossing += line.stored_bytes
        for name in line.reads:
            maker = made.get(name)
            if maker is None or maker.number in crossed:
                continue
            if (maker.number in device_lines) != on_device:
                crossing += maker.out_bytes
                crossed.add(maker.number)
        for name in line.binds:
            made[name] = line
    return t + _over(crossing, link_bytes_per_s)


def _best_run(
    lines: Sequence[LineEstimate], first: int, cut: Cut, link: float
) -> tuple[int, float]:
    """The run of lines from ``first`` whose move gives the least time: (its end, that time)."""
    best_end, best_t = first + 1, float("inf")
    run: set[int] = set()
    combined: set[str] = set()  # what the run's reductions bind: only on the host
    for end in range(first, len(lines)):
        line = lines[end]
        if not line.movable or line.reads & combined:
            break
        if line.reduction:
            combined |= line.binds
        run.add(line.number)
        t = time_of(lines, cut.device_lines | run, link)
        if t < best_t:
            best_end, best_t = end + 1, t
    return best_end, best_t


def _over(size_bytes: float, link_bytes_per_s: float) -> float:
    return 0.0 if link_bytes_per_s == float("inf") else transfer_s(size_bytes, link_bytes_per_s)
