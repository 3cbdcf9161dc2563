"""`quarry demo` as a user reads it: sizes in units that show them, queries timed warm."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from quarry.demo import run_demo


@pytest.mark.slow
def test_the_demo_times_warm_queries_and_shows_small_sizes():
    out = Console(width=120, record=True, file=io.StringIO())
    run_demo(out, rows=20_000, devices=2, profile="host")
    shown = out.export_text()
    assert "cold start" in shown and "untimed" in shown, shown
    # 20,000 rows are about 800 KiB: kilobytes shown as such, never as "0.00 MB"
    assert not re.search(r"\b0\.0+ MB\b", shown), shown
    assert re.search(r"stored physics/particles: 20,000 rows, \d+\.\d KiB", shown), shown
    queries = [row.strip(" │").split("│") for row in shown.splitlines() if "SELECT" in row]
    shipped = [cells[-1].strip() for cells in queries]
    assert len(shipped) == 6, shown  # two queries, three pushdown modes
    assert all(re.fullmatch(r"\d+ B|\d+\.\d (KiB|MiB)", cell) for cell in shipped), shipped
