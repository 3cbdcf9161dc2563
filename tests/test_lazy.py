"""quarry.lazy: a value worked out once per instance, on first use, and never behind a lock that
makes one instance's first use wait for another's."""

from __future__ import annotations

import threading

from quarry.lazy import cached_property


class _Plan:
    computed = 0

    def __init__(self, meeting: threading.Barrier | None = None):
        self.meeting = meeting

    @cached_property
    def decoded(self) -> int:
        """A docstring kept."""
        _Plan.computed += 1
        if self.meeting is not None:
            self.meeting.wait()  # both instances inside at once, or this times out
        return id(self)


def test_a_value_is_computed_once_and_kept_on_its_instance() -> None:
    _Plan.computed = 0
    plan = _Plan()
    assert plan.decoded == plan.decoded == id(plan)
    assert _Plan.computed == 1 and plan.__dict__["decoded"] == id(plan)
    assert _Plan.decoded.__doc__ == "A docstring kept."


def test_two_instances_compute_at_once() -> None:
    """Python 3.11's functools.cached_property holds one lock for every instance while it
    computes: the second thread would wait for the first, which waits for it."""
    meeting = threading.Barrier(2, timeout=10)
    plans = [_Plan(meeting), _Plan(meeting)]
    errors: list[BaseException] = []

    def use(plan: _Plan) -> None:
        try:
            assert plan.decoded == id(plan)
        except BaseException as error:  # a broken barrier: they did not meet
            errors.append(error)

    threads = [threading.Thread(target=use, args=(plan,)) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not errors
