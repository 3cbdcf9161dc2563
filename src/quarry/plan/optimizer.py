"""The optimizer: an ordered list of named rules run over one subject (the query's Substrait plan,
the cut, the finished decomposition), as DataFusion's `Optimizer` and sqlglot's
`optimize(expression, rules=RULES)` run theirs.

It owns the walk, so the rules need not: it copies its input once (not once per rule: a rule
changes the copy in place), runs the rules in order, runs a `Fixpoint`'s rules round after round
up to its bound, and records each rule that changed the subject, with a snapshot of the subject
after it, for EXPLAIN VERBOSE. A snapshot is the subject's bytes as they were (the next rule
changes the subject in place); its text is rendered only when someone asks for it, so an
ordinary query pays for a serialization per rule that fired, never for the text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from quarry.lazy import cached_property
from quarry.plan.rules import Fixpoint, Rule, RuleDidNotSettle

Subject = TypeVar("Subject")


class Snapshot(Protocol):
    """The subject as a rule left it, rendered on demand."""

    def render(self) -> str: ...


@dataclass(frozen=True)
class Fired:
    """A rule that changed the subject, and the subject after it."""

    rule: str
    after: Snapshot

    @cached_property
    def plan(self) -> str:
        return self.after.render()

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "plan": self.plan}


def optimize(
    subject: Subject,
    rules: Sequence[Rule[Subject] | Fixpoint[Subject]],
    snapshot: Callable[[Subject], Snapshot],
    copy: Callable[[Subject], Subject] | None = None,
) -> tuple[Subject, tuple[Fired, ...]]:
    """``subject`` after ``rules``, in order, and the rules that changed it.

    ``copy`` makes the one copy the rules change (none when there is no rule); None when the
    rules never change their argument (they build a new subject) or the caller hands over one
    nobody else holds.
    """
    if copy is not None and rules:
        subject = copy(subject)
    fired: list[Fired] = []
    for step in rules:
        if isinstance(step, Fixpoint):
            subject = _settled(subject, step, snapshot, fired)
        else:
            subject, _ = _applied(subject, step, snapshot, fired)
    return subject, tuple(fired)


def _applied(
    subject: Subject,
    rule: Rule[Subject],
    snapshot: Callable[[Subject], Snapshot],
    fired: list[Fired],
) -> tuple[Subject, bool]:
    try:
        subject, changed = rule.apply(subject)
    except RuleDidNotSettle as error:
        raise RuleDidNotSettle(f"rule {rule.name} did not settle: {error}") from None
    if changed:
        fired.append(Fired(rule.name, snapshot(subject)))
    return subject, changed


def _settled(
    subject: Subject,
    fixpoint: Fixpoint[Subject],
    snapshot: Callable[[Subject], Snapshot],
    fired: list[Fired],
) -> Subject:
    """The fixpoint's rules in turn until a round changes nothing; past ``rounds_max`` rounds a
    rule keeps undoing another's work, and that is a bug to name, not a query to wait on."""
    for _ in range(fixpoint.rounds_max):
        changed = False
        for rule in fixpoint.rules:
            subject, changed_now = _applied(subject, rule, snapshot, fired)
            changed = changed or changed_now
        if not changed:
            return subject
    names = ", ".join(rule.name for rule in fixpoint.rules)
    raise RuleDidNotSettle(
        f"rules {names} ({fixpoint.name}) still changed the cut after {fixpoint.rounds_max} rounds"
    )
