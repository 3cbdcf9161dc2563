"""Fuzz targets in child processes: a crash (the child dies) or a hang (it outlives its time)
is counted against the chunk that caused it, with the command that reproduces it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from quarry.fuzz.core import Outcomes

CHUNK_BASE_S = 60.0  # start-up and seeds
CHUNK_PER_INPUT_S = 0.5  # far above any target's typical input (h5ad: a child process each)


@dataclass(frozen=True)
class Chunk:
    target: str
    seed: int
    inputs: int

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "quarry.fuzz",
            self.target,
            "--inputs",
            str(self.inputs),
            "--seed",
            str(self.seed),
        ]

    def run(self) -> Outcomes:
        reproduce = " ".join(["python", *self.command()[1:]])
        try:
            done = subprocess.run(
                self.command(),
                capture_output=True,
                text=True,
                timeout=CHUNK_BASE_S + CHUNK_PER_INPUT_S * self.inputs,
            )
        except subprocess.TimeoutExpired:
            return Outcomes(hangs=1, examples={"hang": [reproduce]})
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [""])[-1][:200]
            return Outcomes(crashes=1, examples={"crash": [f"{reproduce}: {last}"]})
        return Outcomes.from_json(json.loads(done.stdout.strip().splitlines()[-1]))


def chunks(plan: dict[str, int], chunk_inputs: int, seed: int) -> list[Chunk]:
    """``plan``: target -> inputs, cut into chunks with seeds of their own."""
    out = []
    for target, total in plan.items():
        for number, first in enumerate(range(0, total, chunk_inputs)):
            inputs = min(chunk_inputs, total - first)
            out.append(Chunk(target, seed * 1_000_003 + number, inputs))
    return out


def run(
    work: Iterable[Chunk],
    workers: int,
    done: Callable[[Chunk, Outcomes], None] = lambda chunk, outcomes: None,
) -> dict[str, Outcomes]:
    """Every chunk, ``workers`` at a time; outcomes summed per target."""
    totals: dict[str, Outcomes] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [(chunk, pool.submit(chunk.run)) for chunk in work]
        for chunk, future in futures:
            outcomes = future.result()
            totals.setdefault(chunk.target, Outcomes()).add(outcomes)
            done(chunk, outcomes)
    return totals
