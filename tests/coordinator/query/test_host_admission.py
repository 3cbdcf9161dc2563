"""The host's turns: long queries wait for one, short ones and a thread already holding one
do not; a turn comes back once however often it is given."""

from __future__ import annotations

import threading
import time

from quarry.coordinator.query.host_admission import Workload, shape


def test_queries_that_differ_in_constants_share_a_shape():
    assert shape("SELECT * FROM t WHERE id BETWEEN 10 AND 109") == shape(
        "select *  from t where id between 7 and 1e3"
    )
    assert shape("SELECT 'a' FROM t") == shape("SELECT 'it''s' FROM t")
    assert shape("SELECT a FROM t") != shape("SELECT b FROM t")


def test_long_queries_take_turns_and_short_ones_do_not_wait():
    workload = Workload(slots=1, short_s=0.25)
    first = workload.admit("SELECT sum(x) FROM big")  # never seen: long
    entered = threading.Event()

    def second() -> None:
        workload.admit("SELECT avg(x) FROM big").release()
        entered.set()

    waiting = threading.Thread(target=second)
    waiting.start()
    assert not entered.wait(0.2)  # the only turn is taken
    workload.learn("SELECT id FROM big WHERE id = 1", 0.05)
    started = time.perf_counter()
    workload.admit("SELECT id FROM big WHERE id = 99").release()  # short: straight through
    assert time.perf_counter() - started < 0.1
    first.release()
    assert entered.wait(5)
    waiting.join()
    first.release()  # twice is harmless: the bound stays one
    assert workload.status()["long"] == 2 and workload.status()["short"] == 1


def test_a_thread_holding_a_turn_is_not_made_to_wait_for_itself():
    workload = Workload(slots=1)
    held = workload.admit("SELECT a FROM one")
    nested = workload.admit("SELECT b FROM two")  # would wait forever for itself otherwise
    nested.release()
    held.release()
    workload.admit("SELECT c FROM three").release()


def test_the_least_time_of_a_shape_is_what_it_is_expected_to_take():
    workload = Workload(slots=2, short_s=0.25)
    for seconds in (3.0, 0.1, 2.0):  # slow under contention, fast when quiet
        workload.learn("SELECT x FROM t WHERE y > 5", seconds)
    assert workload.expected_s("SELECT x FROM t WHERE y > 6") == 0.1


def test_a_turn_says_whether_it_was_long_and_how_long_it_waited():
    workload = Workload(slots=1)
    first = workload.admit("SELECT a FROM big")
    assert first.long and first.waited_s < 0.1
    threading.Timer(0.2, first.release).start()
    second = threading.Thread(target=lambda: waited.append(workload.admit("SELECT b FROM big")))
    waited: list = []
    second.start()
    second.join(5)
    assert waited[0].long and waited[0].waited_s >= 0.15
    waited[0].release()
