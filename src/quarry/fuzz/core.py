"""Mutations and outcomes: what every fuzz target shares.

Mutations flip bits, insert, delete, repeat and truncate bytes, splice seeds together and, for
JSON headers, replace values with values of other types. An input's outcome is one of: accepted,
a clear error (a ``QuarryError``: the user is told what was wrong), an unclear error (any other
exception: a bug to fix), a hang (longer than ``HANG_S``) or a crash (the process died; targets
run in worker processes so that a crash is counted rather than fatal, see ``__main__``).
"""

from __future__ import annotations

import json
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quarry.errors import QuarryError

HANG_S = 10.0
EXAMPLES_MAX = 5  # unclear errors kept per class, to reproduce them
MUTATIONS_PER_INPUT_MAX = 4


@dataclass
class Outcomes:
    """What one target did with its inputs."""

    inputs: int = 0
    accepted: int = 0
    clear: Counter = field(default_factory=Counter)  # error class -> count
    unclear: Counter = field(default_factory=Counter)
    hangs: int = 0
    crashes: int = 0
    slowest_s: float = 0.0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, other: Outcomes) -> None:
        self.inputs += other.inputs
        self.accepted += other.accepted
        self.clear.update(other.clear)
        self.unclear.update(other.unclear)
        self.hangs += other.hangs
        self.crashes += other.crashes
        self.slowest_s = max(self.slowest_s, other.slowest_s)
        for name, examples in other.examples.items():
            kept = self.examples.setdefault(name, [])
            kept.extend(examples[: EXAMPLES_MAX - len(kept)])

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs,
            "accepted": self.accepted,
            "clear_errors": dict(self.clear.most_common()),
            "unclear_errors": dict(self.unclear.most_common()),
            "hangs": self.hangs,
            "crashes": self.crashes,
            "slowest_s": round(self.slowest_s, 4),
            "examples": self.examples,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Outcomes:
        return cls(
            body["inputs"],
            body["accepted"],
            Counter(body["clear_errors"]),
            Counter(body["unclear_errors"]),
            body["hangs"],
            body["crashes"],
            body["slowest_s"],
            body["examples"],
        )


# ---- mutations ----------------------------------------------------------------------------------


def mutate(data: bytes, rng: random.Random, seeds: list[bytes]) -> bytes:
    """One to a few random edits of ``data``."""
    out = bytearray(data)
    for _ in range(rng.randint(1, MUTATIONS_PER_INPUT_MAX)):
        choice = rng.randrange(8)
        position = rng.randrange(len(out) + 1)
        if choice == 0 and out:  # flip a bit
            index = rng.randrange(len(out))
            out[index] ^= 1 << rng.randrange(8)
        elif choice == 1:  # insert random bytes
            out[position:position] = rng.randbytes(rng.randint(1, 16))
        elif choice == 2 and out:  # delete a run
            del out[position : position + rng.randint(1, 32)]
        elif choice == 3:  # truncate
            del out[position:]
        elif choice == 4 and out:  # repeat a run
            end = min(len(out), position + rng.randint(1, 64))
            out[position:position] = out[position:end] * rng.randint(1, 8)
        elif choice == 5 and seeds:  # splice another seed in
            other = rng.choice(seeds)
            cut = rng.randrange(len(other) + 1)
            out[position:] = other[cut:]
        elif choice == 6 and out:  # an interesting byte
            out[rng.randrange(len(out))] = rng.choice((0x00, 0x7F, 0x80, 0xFF, 0x22, 0x7B))
        else:  # a JSON value of another type, where the input holds JSON
            out = bytearray(_mutate_json(bytes(out), rng))
    return bytes(out)


ODD_VALUES: tuple[Any, ...] = (
    None,
    True,
    -1,
    0,
    2**63,
    1e308,
    float("nan"),
    "",
    "x" * 300,
    [],
    {},
    [1, "a"],
    {"a": None},
)


def _mutate_json(data: bytes, rng: random.Random) -> bytes:
    start, end = data.find(b"{"), data.rfind(b"}")
    if start < 0 or end <= start:
        return data
    try:
        body = json.loads(data[start : end + 1])
    except ValueError:
        return data
    if not isinstance(body, dict) or not body:
        return data
    key = rng.choice(sorted(body))
    body[key] = rng.choice(ODD_VALUES)
    replaced = json.dumps(body, separators=(",", ":")).encode()
    prefix = data[:start]
    if len(prefix) >= 7 and prefix[:3] == b"QRY":  # keep a frame's length honest, sometimes
        prefix = prefix[:3] + len(replaced).to_bytes(4, "big")
    return prefix + replaced + data[end + 1 :]


# ---- running -------------------------------------------------------------------------------------


def run(
    target: Callable[[bytes], Any],
    seeds: list[bytes],
    inputs: int,
    rng: random.Random,
    clear: tuple[type[BaseException], ...] = (QuarryError,),
) -> Outcomes:
    """Feed ``inputs`` mutations of the seeds to ``target``; count what happened."""
    outcomes = Outcomes()
    for _ in range(inputs):
        data = mutate(rng.choice(seeds), rng, seeds)
        started = time.perf_counter()
        try:
            target(data)
            outcomes.accepted += 1
        except clear as error:
            outcomes.clear[type(error).__name__] += 1
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt):
                raise
            name = type(error).__name__
            outcomes.unclear[name] += 1
            kept = outcomes.examples.setdefault(name, [])
            if len(kept) < EXAMPLES_MAX:
                detail = traceback.format_exception_only(type(error), error)[-1].strip()
                kept.append(f"{detail[:300]} | input {data[:80]!r}")
        elapsed = time.perf_counter() - started
        outcomes.slowest_s = max(outcomes.slowest_s, elapsed)
        outcomes.hangs += elapsed > HANG_S
        outcomes.inputs += 1
    return outcomes
