"""A device's quarantine of sub-plan shapes: kept on disk, expiring by itself, lifted on demand."""

from __future__ import annotations

import json
import time

from quarry.device.quarantine import QUARANTINE_FILE, Quarantine
from quarry.protocol.control import QuarantineCause


def test_a_quarantine_expires_by_itself_and_a_restart_keeps_it(tmp_path):
    held = Quarantine(tmp_path, "dev0", quarantine_s=0.3)
    assert held.holds("d/t", "substrait", lambda: "never asked") is None  # nothing of d/t
    entry = held.enter("d/t", "substrait", "s1", QuarantineCause.FAILED_STAGE, "it panicked")
    assert held.holds("d/t", "substrait", lambda: "s1") == entry
    assert held.holds("d/t", "substrait", lambda: "s2") is None  # another shape runs
    assert held.holds("d/u", "substrait", lambda: "s1") is None  # so does another dataset
    assert Quarantine(tmp_path, "dev0").held() == (entry,)  # the device restarted
    time.sleep(0.35)
    assert held.holds("d/t", "substrait", lambda: "s1") is None
    assert held.held() == () and json.loads((tmp_path / QUARANTINE_FILE).read_text()) == {
        "quarantined": []
    }


def test_clear_lifts_everything_and_an_unreadable_file_starts_afresh(tmp_path):
    held = Quarantine(tmp_path, "dev0")
    held.enter("d/t", "substrait", "s1", QuarantineCause.TIME_LIMIT, "ran 400 s")
    held.enter("d/t", "substrait", "s2", QuarantineCause.FAILED_STAGE, "fault")
    assert held.clear() == 2 and held.held() == () and held.clear() == 0
    (tmp_path / QUARANTINE_FILE).write_text("{not json")
    assert Quarantine(tmp_path, "dev0").held() == ()  # what it forgot fails again, if it does
