"""The edge users hold: only a QuarryError leaves it. Anything else becomes an InternalError
that names the query, what failed and that it is a bug, with its traceback in the log."""

from __future__ import annotations

import logging
import sys

import pytest
import typer

from quarry import cli_common
from quarry.errors import (
    QUERY_CHARS_SHOWN_MAX,
    InternalError,
    QueryError,
    error_class,
    only_quarry_errors,
    only_quarry_errors_in,
    shown,
)


def test_an_unexpected_error_becomes_an_internal_error_naming_the_query(caplog):
    with (
        caplog.at_level(logging.ERROR, logger="quarry.errors"),
        pytest.raises(InternalError) as raised,
        only_quarry_errors("SELECT 1\n  FROM t"),
    ):
        raise AssertionError("visible fields 2 != 3")
    message = str(raised.value)
    assert "AssertionError: visible fields 2 != 3" in message and "bug" in message
    assert message.endswith("query: SELECT 1 FROM t")
    assert raised.value.query == "SELECT 1\n  FROM t"
    assert isinstance(raised.value.__cause__, AssertionError)
    (record,) = caplog.records
    assert record.exc_info is not None and "SELECT 1 FROM t" in record.getMessage()


def test_quarry_errors_and_interruptions_pass_as_they_are():
    error = QueryError("no such table")
    with pytest.raises(QueryError) as raised, only_quarry_errors("SELECT 1"):
        raise error
    assert raised.value is error
    with pytest.raises(KeyboardInterrupt), only_quarry_errors("SELECT 1"):
        raise KeyboardInterrupt


def test_an_internal_error_raised_before_the_query_was_known_gets_it():
    with pytest.raises(InternalError) as raised, only_quarry_errors("SELECT 2"):
        raise InternalError("decomposition changed the result types")
    assert str(raised.value).startswith("internal error in quarry (decomposition changed")
    assert str(raised.value).endswith("query: SELECT 2")


def test_a_stream_s_errors_are_wrapped_where_it_is_read():
    def batches():
        yield 1
        raise ValueError("half way")

    stream = only_quarry_errors_in(batches(), "SELECT 3")
    assert next(stream) == 1
    with pytest.raises(InternalError, match="ValueError: half way"):
        next(stream)


def test_a_long_query_is_shown_cut_on_one_line():
    text = shown("SELECT " + "x, " * 500 + "\n y FROM t")
    assert len(text) == QUERY_CHARS_SHOWN_MAX and text.endswith("...") and "\n" not in text


def test_an_internal_error_crosses_the_wire_as_itself():
    assert error_class("internal_error") is InternalError


def _app(error: BaseException) -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)

    @app.command()
    def fail() -> None:
        raise error

    @app.command()
    def other() -> None:  # two commands: the app takes the command's name
        pass

    return app


def test_the_cli_prints_one_line_for_a_bug_and_keeps_the_traceback_in_a_file(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["quarry", "fail"])
    with pytest.raises(SystemExit) as exited:
        cli_common.run(_app(AssertionError("visible fields 2 != 3")))
    assert exited.value.code == cli_common.EXIT_BUG
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: internal error in quarry (AssertionError: visible")
    assert [line for line in lines if line.startswith("error:")] == [lines[0]]
    path = lines[-1].removeprefix("traceback: ")
    with open(path) as file:
        trace = file.read()
    assert "Traceback" in trace and "visible fields 2 != 3" in trace


def test_the_cli_prints_a_user_error_as_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["quarry", "fail"])
    with pytest.raises(SystemExit) as exited:
        cli_common.run(_app(QueryError("table 'nope' not found\nhint: known tables: t")))
    assert exited.value.code == cli_common.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: table 'nope' not found") and "Traceback" not in err
