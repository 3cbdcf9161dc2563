"""Errors of the planning layer, each with a message a user can act on."""

from __future__ import annotations

from quarry.errors import QueryError


class PlanError(QueryError):
    """The query cannot be planned: bad syntax, unknown table or column, a type error.

    The message is complete on its own (what was wrong and what to do), so callers print it
    without a traceback. A ``QueryError`` (so a ``QuarryError``): it leaves ``Cluster`` as it is.
    Kinds a caller acts on have classes of their own, never a test of the message's words.
    """

    code = "plan_error"


class UnknownTable(PlanError):
    """The query names a table the catalog does not hold (a device that does not answer may
    hold it: the coordinator says so)."""

    code = "unknown_table"


class NotSupported(PlanError):
    """Valid SQL that quarry cannot run as DataFusion alone would answer it; the message says
    what is not supported and how to write the query instead."""

    code = "not_supported"


class NeedsHostEngine(NotSupported):
    """Valid SQL whose super-plan DataFusion cannot run (a subquery correlated by more than
    equalities, output names that repeat): ``decompose`` hands the super-plan to DuckDB
    (``duckdb_super``). ``output`` is the answer's schema where DataFusion planned the query,
    ``plan`` its optimized plan, indented; the message says why, should it ever reach a user."""

    def __init__(self, message: str, output=None, plan: str = "") -> None:
        super().__init__(message)
        self.output = output
        self.plan = plan


class StageError(RuntimeError):
    """A sub-plan stage cannot be decoded or run; the message names the operator.

    One that cannot be decoded or planned makes a device hand the work back (the coordinator
    runs that part itself); one met ``while_running`` (division by zero, a bad cast) is the
    query's own error, the same wherever it runs, unless the engine ``panicked`` (a Rust panic:
    a bug of the engine, not the query's) or ran out of ``memory``: then a device hands the
    range back too.
    """

    def __init__(
        self,
        message: str,
        operator: str = "",
        while_running: bool = False,
        panicked: bool = False,
        memory: bool = False,
    ) -> None:
        super().__init__(message)
        self.operator = operator
        self.while_running = while_running
        self.panicked = panicked
        self.memory = memory


def is_panic(error: BaseException) -> bool:
    """A Rust panic of the engine (pyo3's ``PanicException``, which Python cannot import)."""
    return type(error).__name__ == "PanicException"


def is_out_of_memory(error: BaseException) -> bool:
    """The engine could not allocate: Arrow's or Python's ``MemoryError``, or DataFusion's
    "Resources exhausted" (a memory pool's bound)."""
    return isinstance(error, MemoryError) or "Resources exhausted" in str(error)


def is_engine_failure(error: BaseException) -> bool:
    """An error the engine raised about its input, including a Rust panic (``PanicException``
    derives from BaseException), as opposed to the interpreter stopping or a generator closing.
    """
    return not isinstance(error, KeyboardInterrupt | SystemExit | GeneratorExit)
