"""Where the devices settled last time is where a fragment starts the next (``pushdown="auto"``).

The cost model picks each fragment's first cut from one slice sampled on the host. When it
errs towards the host (``filter`` or ``raw`` where the devices' own measurements say ``full``
is cheaper), every run pays for it: the devices measure the first chunks at the wrong cut,
the host fetches and completes what they handed back, and only then do they switch. A run's
reports say what the devices concluded, so the next run of the same fragment over the same
data version starts there, as a plan cache keeps what planning learnt (and as DB2's learning
optimizer and SQL Server's feedback correct estimates from what execution saw).

Only a conclusion of more work on the devices is kept. Handing work back reflects load at the
time (a busy drive, a calibrated slow one); the model weighs the load the devices report at
each query, and the devices still measure and decide at run time from the start they are given.
A run that ends at the model's own cut, or nearer the host, forgets what was kept: the start is
the model's again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection, Iterable

from quarry.coordinator.dispatch.report import WorkReport
from quarry.cost.model import CUTS
from quarry.protocol.stage import Stage

SETTLED_MAX = 256  # fragments remembered; the oldest go first

Key = tuple[bytes, str]  # the fragment's full sub-plan (Substrait bytes), the data's version


class Settled:
    """Per fragment and data version, the cut the devices settled on past the model's. Queries
    of one host (and of every Flight SQL session) share it, from their own threads."""

    def __init__(self, size_max: int = SETTLED_MAX) -> None:
        self.size_max = size_max
        self._cuts: dict[Key, Stage] = {}
        self._lock = threading.Lock()

    def start(self, key: Key, model_cut: Stage, allowed: Collection[Stage]) -> Stage | None:
        """The cut to start from instead of the model's, if the devices settled past it."""
        with self._lock:
            cut = self._cuts.get(key)
        if cut is None or cut not in allowed or not _more_on_devices(cut, model_cut):
            return None
        return cut

    def learn(self, key: Key, model_cut: Stage, reports: Iterable[WorkReport]) -> None:
        """Keep what the devices ended at, if past the model's cut; otherwise forget."""
        cut = ended_at(reports)
        with self._lock:
            self._cuts.pop(key, None)
            if cut is None or not _more_on_devices(cut, model_cut):
                return
            while len(self._cuts) >= self.size_max:
                del self._cuts[next(iter(self._cuts))]
            self._cuts[key] = cut


def ended_at(reports: Iterable[WorkReport]) -> Stage | None:
    """The cut most of a fragment's partitions ended at (each partition's last decision to run
    or hand back a range): None if none decided one (all pruned, cached or scanned by the host).
    Ties go to the cut that does more on the devices."""
    ends = Counter(
        last
        for r in reports
        if r.mode == "subplan"
        and (last := next((Stage(d.stage) for d in reversed(r.decisions) if d.stage in CUTS), None))
    )
    if not ends:
        return None
    return max(ends, key=lambda stage: (ends[stage], -CUTS.index(stage)))


def _more_on_devices(cut: Stage, than: Stage) -> bool:
    return CUTS.index(cut) < CUTS.index(than)
