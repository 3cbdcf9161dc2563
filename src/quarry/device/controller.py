"""The device's run-time decisions: for each range of slices, how much of the sub-plan to run.

Stages, from most to least work on the device (the host completes whatever is left):
    full    the whole sub-plan; results stream back
    filter  scan + filter only; the host fetches the filtered rows and runs the rest
    raw     nothing; the host fetches the slices as stored (push back)

Every decision is recorded with its slice range and reason; the sequence of them is the
annotated sub-plan the device returns (Skytether §4: annotations, quality-of-service hints). A
range handed back also says why in one word (``PushBack``): ``busy`` when others' work loads the
drive, ``slow`` when an idle drive is simply the dearer path (``declined_for``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from quarry.cost.eq1 import (
    cut_s_per_byte,
    device_path_s_per_byte,
    host_path_s_per_byte,
    on_host_share,
)
from quarry.cost.model import handback_s
from quarry.protocol.stage import PushBack, Skip, Stage
from quarry.protocol.work import Decision, HostCost, Policy

PUSHBACK_NOTICE_SLICES = 16  # slices handed back are announced in groups: a fetch each
# A drive this loaded by background work is busy: the work it declines is declined for load.
BUSY_BACKGROUND_LOAD_MIN = 0.5


def declined_for(load: Mapping[str, float]) -> PushBack:
    """Why a drive (or a storage server) hands work back that it judged dearer than the host
    path: ``busy`` if others' work loads it (a background load, or work waiting for its cores),
    ``slow`` otherwise. Its CPU busy alone cannot tell: the query's own chunks fill the drive's
    slots while it measures."""
    others = load["background_load"] >= BUSY_BACKGROUND_LOAD_MIN or load["run_queue"] >= 1
    return PushBack.BUSY if others else PushBack.SLOW


class Decided(NamedTuple):
    """The controller's decision for the next chunk: its stage, the reason in words, when to
    try again (with a decline) and why in one word (with a decline)."""

    stage: Stage
    reason: str
    retry_after_s: float | None
    pushed_back: PushBack | None


class Annotation:
    """What a device did with a unit of work, slice range by slice range: one entry per run of
    equal decisions (the annotated sub-plan of Skytether §4)."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def record(self, decision: Decision) -> None:
        last = self.decisions[-1] if self.decisions else None
        if (
            last is not None
            and last.end == decision.first
            and last.stage == decision.stage
            and last.reason == decision.reason
            and last.pushed_back == decision.pushed_back
        ):
            self.decisions[-1] = replace(last, end=decision.end)
        else:
            self.decisions.append(decision)

    def slices(self, stage: Stage | Skip) -> int:
        return sum(d.end - d.first for d in self.decisions if d.stage == stage)

    def revise(self, decision: Decision) -> None:
        """``decision`` in place of what was recorded for its slices (a chunk recorded as run
        whole whose stage then failed): the entries it overlaps keep only their other slices."""
        kept: list[Decision] = []
        at = None
        for old in self.decisions:
            if old.end <= decision.first or old.first >= decision.end:
                kept.append(old)
                continue
            if at is None:
                at = len(kept)
            if old.first < decision.first:
                kept.append(replace(old, end=decision.first))
                at = len(kept)
            if old.end > decision.end:
                kept.append(replace(old, first=decision.end))
        kept.insert(len(kept) if at is None else at, decision)
        self.decisions = kept


class Adaptive:
    """Decide per slice range between running the sub-plan and pushing back (Skytether §5.3).

    Asked to execute, the device runs the first chunks, ignores the warm-up outlier, and from
    then on compares its measured cost per stored byte with the host's: Eq. 1 of ActivePy,
    push down when  DS_raw/BW + CT_host  >  CT_device + DS_processed/BW.
    Pushing back, it probes now and then (backing off while probes confirm) so a drive whose
    load fell takes the work back. One controller serves every partition of a query on the
    device, so what one partition measured informs the others.
    """

    def __init__(self, policy: Policy, host: HostCost, load: Any):
        self.policy = policy
        self.host = host
        self.load = load  # callable -> {"cpu_busy", "run_queue", "background_load"}
        # (device s per stored byte, output bytes per stored byte), per stage the device ran
        self.samples: dict[Stage, list[tuple[float, float]]] = {Stage.FULL: [], Stage.FILTER: []}
        self.seen = 0
        self.current = Stage(host.start)
        self.measuring = self.current in (Stage.FULL, Stage.FILTER)
        self.reason = f"{self.current}: the cut chosen above it"
        self.why: PushBack | None = None  # why the current stage declines work (found lazily)
        self.probe_after_s = policy.probe_after_s
        self.next_probe_at = time.monotonic() + self.probe_after_s
        self.probing = False
        self._lock = threading.Lock()

    def observe(self, stage: Stage, stored_bytes: int, output_bytes: int, seconds: float) -> None:
        stage = Stage(stage)
        if stage not in self.samples or stored_bytes <= 0:
            return
        with self._lock:
            self.seen += 1
            if self.seen <= self.policy.warmup_chunks:
                return  # warm-up outlier (Skytether Exp 2): never let it drive a decision
            samples = self.samples[stage]
            samples.append((seconds / stored_bytes, output_bytes / stored_bytes))
            del samples[: -self.policy.window]
            if self.probing and stage is Stage.FULL:
                self.probing = False
                del samples[:-1]  # the probe is the news: judge by it alone

    def costs(self, handback_bytes: int = 0) -> dict[Stage, float] | None:
        """Seconds per stored byte of each choice, from the recent measurements. A range handed
        back of ``handback_bytes`` (0: not known) also costs a fetch and a run on the host
        whatever its size (``cost.model.handback_s``), spread over its bytes."""
        full, filtered = self.samples[Stage.FULL], self.samples[Stage.FILTER]
        if not full and not filtered:
            return None

        def median(values: list[float]) -> float:
            return sorted(values)[len(values) // 2]

        bw = self.host.link_bytes_per_s
        host_s = on_host_share(self.host.full_s_per_byte, self.host.host_share)
        host_rest_s = on_host_share(
            max(self.host.full_s_per_byte - self.host.filter_s_per_byte, 0.0), self.host.host_share
        )
        # a stage not measured yet is estimated from the other: filtering is at most the whole
        # sub-plan's work, and the whole sub-plan at least the filter's
        full_s = median([s for s, _ in full]) if full else median([s for s, _ in filtered])
        filter_s = median([s for s, _ in filtered]) if filtered else full_s
        out_ratio = median([o for _, o in full]) if full else self.host.filter_ratio
        filter_ratio = median([o for _, o in filtered]) if filtered else self.host.filter_ratio
        fixed_s_per_byte = 0.0
        if handback_bytes > 0:
            device_s, completer_s = handback_s(1)
            completer_s = on_host_share(completer_s, self.host.host_share)
            fixed_s_per_byte = (device_s + completer_s) / handback_bytes
        return {
            Stage.FULL: device_path_s_per_byte(full_s, out_ratio, bw),
            Stage.RAW: host_path_s_per_byte(self.host.raw_ratio, bw, host_s) + fixed_s_per_byte,
            # the host then finishes the sub-plan on what passed the filter
            Stage.FILTER: cut_s_per_byte(filter_s, filter_ratio, bw, host_rest_s)
            + fixed_s_per_byte,
        }

    def probe_worth_it(self, slice_bytes: int, remaining_bytes: int) -> bool:
        """A probe is worth its cost only when that cost is small beside the work left.

        Executing one slice costs its bytes at the device's full cost per byte (measured, or
        the host's estimate), several times that if the device has not run the sub-plan yet
        (warm-up); the work left costs the remaining bytes at the current decision's price.
        """
        full = self.samples[Stage.FULL]
        if full:
            per_byte = sorted(s for s, _ in full)[len(full) // 2]
            warmup = 1.0
        else:
            per_byte = self.host.device_full_s_per_byte
            warmup = self.policy.warmup_factor
        costs = self.costs() or {}
        current = costs.get(self.current)
        if current is None:
            current = self._static_cost(self.current)
        if not per_byte or current is None:
            return True  # nothing to judge by: probe, that is how we learn
        probe_s = slice_bytes * per_byte * warmup
        return probe_s <= self.policy.probe_budget * remaining_bytes * current

    def _static_cost(self, stage: Stage) -> float | None:
        """The host's price of a stage per stored byte, before the device measured anything."""
        if stage is Stage.RAW:
            host_s = on_host_share(self.host.full_s_per_byte, self.host.host_share)
            return host_path_s_per_byte(self.host.raw_ratio, self.host.link_bytes_per_s, host_s)
        return None

    def stage_for(self, number: int, slice_bytes: int = 0, remaining_bytes: int = 0) -> Decided:
        """The decision for the next chunk, starting at slice ``number``; ``slice_bytes`` and
        ``remaining_bytes`` (this slice and every one left, stored) let the device judge
        whether a probe pays."""
        with self._lock:
            stage, reason, retry_after_s = self._stage_for(number, slice_bytes, remaining_bytes)
            if stage is Stage.FULL:
                return Decided(stage, reason, retry_after_s, None)
            if self.why is None:  # asked once per change of stage: reading the load costs
                self.why = declined_for(self.load())
            return Decided(stage, reason, retry_after_s, self.why)

    def _stage_for(
        self, number: int, slice_bytes: int, remaining_bytes: int
    ) -> tuple[Stage, str, float | None]:
        """``stage_for``'s choice, under its lock."""
        now = time.monotonic()
        if self.measuring:
            needed = self.policy.warmup_chunks + self.policy.sample_chunks
            if self.seen < needed:
                reason = f"{self.current}: measuring the first chunks"
                return self.current, reason, self._retry_after(now)
            self.measuring = False
        if (
            self.current is not Stage.FULL
            and not self.probing
            and now >= self.next_probe_at
            and (not remaining_bytes or self.probe_worth_it(slice_bytes, remaining_bytes))
        ):
            self.probing = True
            self.probe_after_s = min(self.probe_after_s * 2, self.policy.probe_after_s_max)
            self.next_probe_at = now + self.probe_after_s
            return (
                Stage.FULL,
                "executed: probing whether the device can take the work back",
                None,
            )
        handback_bytes = min(remaining_bytes, PUSHBACK_NOTICE_SLICES * slice_bytes)
        costs = self.costs(handback_bytes)
        if costs is not None:
            best = min(costs, key=costs.__getitem__)
            if (
                best != self.current
                and costs[best] * (1 + self.policy.hysteresis) < costs[self.current]
            ):
                load = self.load()
                self.current = best
                self.why = declined_for(load)
                if best is Stage.FULL:
                    self.probe_after_s = self.policy.probe_after_s
                self.reason = (
                    f"{best}: {costs[best] * 1e9:.2f} ns/B vs {self._others(costs, best)} "
                    f"(device busy {load['cpu_busy']:.0%}, run queue "
                    f"{load['run_queue']:.0f})"
                )
        return self.current, self.reason, self._retry_after(now)

    def _retry_after(self, now: float) -> float | None:
        """QoS hint with every decline: when the device expects to try the work again."""
        if self.current is Stage.FULL:
            return None
        return round(max(0.0, self.next_probe_at - now), 3)

    @staticmethod
    def _others(costs: dict[Stage, float], best: Stage) -> str:
        return ", ".join(f"{k} {v * 1e9:.2f} ns/B" for k, v in costs.items() if k != best)


class Controllers:
    """The device's live controllers, one per query fragment, shared by its partitions."""

    def __init__(self, size_max: int = 256, idle_s_max: float = 120.0):
        self.size_max = size_max
        self.idle_s_max = idle_s_max
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Adaptive, float]] = {}

    def get(self, key: str, create: Any) -> Adaptive:
        now = time.monotonic()
        with self._lock:
            for stale in [k for k, (_, t) in self._entries.items() if now - t > self.idle_s_max]:
                del self._entries[stale]
            if key not in self._entries and len(self._entries) >= self.size_max:
                oldest = min(self._entries, key=lambda k: self._entries[k][1])
                del self._entries[oldest]
            controller = self._entries[key][0] if key in self._entries else create()
            self._entries[key] = (controller, now)
            return controller
