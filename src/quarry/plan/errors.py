"""Errors of the planning layer, each with a message a user can act on."""

from __future__ import annotations


class PlanError(ValueError):
    """The query cannot be planned: bad syntax, unknown table or column, a type error.

    The message is complete on its own (what was wrong and what to do), so callers print it
    without a traceback.
    """


class StageError(RuntimeError):
    """A sub-plan stage cannot be decoded or run; the message names the operator.

    A device answers with this error and the coordinator runs that part itself.
    """

    def __init__(self, message: str, operator: str = "") -> None:
        super().__init__(message)
        self.operator = operator
