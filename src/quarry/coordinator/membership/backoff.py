"""Backing off a busy device: wait as long as it asked (jittered, growing if it keeps refusing),
then ask again, within a bound on the total wait.

Devices refuse new work at their admission bound (``device.admission``) before doing any of it,
so a retry repeats nothing. Many callers refused at once must not come back at once: each waits
between half and one and a half times the device's figure, and longer after each refusal.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from quarry import settings
from quarry.errors import DeviceBusy

T = TypeVar("T")

GROWTH = 1.5  # each further refusal waits this much longer
GROWTH_MAX = 8.0
_JITTER = random.Random()  # one for the process: seeding one per call costs more than the call


class BusyCounter:
    """How often, and how long, calls were held back by busy devices."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries = 0
        self.waited_s = 0.0

    def add(self, pause_s: float) -> None:
        with self._lock:
            self.retries += 1
            self.waited_s += pause_s


def retrying(
    call: Callable[[], T],
    counter: BusyCounter,
    wait_s_max: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, again after each ``DeviceBusy`` until it runs or the waits reach the bound
    (``wait_s_max``, else $QUARRY_BUSY_WAIT_S, read now so that a bad value fails at once)."""
    bound = settings.BUSY_WAIT_S.get() if wait_s_max is None else wait_s_max
    waited, growth = 0.0, 1.0
    while True:
        try:
            return call()
        except DeviceBusy as busy:
            pause = busy.retry_after_ms / 1000 * growth * _JITTER.uniform(0.5, 1.5)
            if waited + pause > bound:
                raise DeviceBusy(
                    f"{busy}; still busy after {waited:.1f} s of retries (the bound is "
                    f"{bound:g} s, ${settings.BUSY_WAIT_S.name})",
                    retry_after_ms=busy.retry_after_ms,
                ) from None
            sleep(pause)
            counter.add(pause)
            waited += pause
            growth = min(GROWTH_MAX, growth * GROWTH)
