"""The pushdown modes: one enum, strings accepted at every edge, each room's own modes checked
there with the allowed ones named."""

from __future__ import annotations

import json

import pytest

from quarry.coordinator.query.run import Query
from quarry.coordinator.reads.sample import sample
from quarry.errors import InvalidOption, QuarryError
from quarry.genes.dispatch import side_statistics
from quarry.plan import decompose
from quarry.pushdown import EVERY_MODE, InvalidPushdown, Pushdown


def test_a_mode_is_its_string():
    assert Pushdown.parse("auto") is Pushdown.AUTO
    assert Pushdown.parse(Pushdown.NEVER) is Pushdown.NEVER
    assert Pushdown.AUTO == "auto" and f"{Pushdown.SERVER}" == "server"
    assert json.dumps({"pushdown": Pushdown.ALWAYS}) == '{"pushdown": "always"}'
    assert {mode.value for mode in EVERY_MODE} == {"never", "server", "always", "auto"}


def test_a_wrong_mode_names_the_allowed_ones():
    every = "pushdown must be one of never, server, always, auto, got 'sometimes'"
    with pytest.raises(InvalidPushdown, match=every):
        Pushdown.parse("sometimes")
    two = "--pushdown must be one of never, always, got 'auto'"
    with pytest.raises(InvalidPushdown, match=two):
        Pushdown.parse("auto", {Pushdown.NEVER, Pushdown.ALWAYS}, name="--pushdown")
    with pytest.raises(InvalidPushdown, match="got 'server'"):
        Pushdown.parse(Pushdown.SERVER, {Pushdown.AUTO})
    assert issubclass(InvalidPushdown, InvalidOption) and issubclass(InvalidPushdown, ValueError)


@pytest.mark.parametrize(
    ("call", "allowed"),
    [
        (lambda mode: Query(None, "SELECT 1", mode), "never, server, always, auto"),
        (lambda mode: sample(None, "physics/particles", 10, mode), "never, always"),
        (lambda mode: side_statistics(None, None, [[0]], mode), "never, always, auto"),
        (lambda mode: decompose("SELECT 1", {}, pushdown=mode), "never, always"),
    ],
)
def test_each_room_checks_its_modes_at_its_edge(call, allowed):
    """Before it reads anything: a room that runs only some modes says which."""
    with pytest.raises(QuarryError, match=f"pushdown must be one of {allowed}, got 'sometimes'"):
        call("sometimes")
    outside = {m for m in Pushdown if m.value not in allowed.split(", ")}
    for mode in outside:
        with pytest.raises(InvalidPushdown, match=f"one of {allowed}, got '{mode}'"):
            call(mode.value)
