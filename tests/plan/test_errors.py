"""Bad input: clear messages a user can act on."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quarry.errors import QuarryError, QueryError
from quarry.plan import PlanError, decompose
from quarry.plan.errors import NotSupported, UnknownTable
from quarry.pushdown import InvalidPushdown

TABLES = {
    "lab/cells": pa.schema([("id", pa.int64()), ("gene", pa.string())]),
    "lab/genes": pa.schema([("gene", pa.string())]),
    "other/genes": pa.schema([("gene", pa.string())]),
}


def error_of(sql: str, **kwargs) -> str:
    with pytest.raises(PlanError) as raised:
        decompose(sql, TABLES, **kwargs)
    return str(raised.value)


def test_plan_error_is_a_query_error() -> None:
    """What cannot be planned leaves quarry as the QueryError every SQL error is."""
    assert issubclass(PlanError, QueryError) and issubclass(PlanError, QuarryError)
    assert issubclass(UnknownTable, PlanError) and issubclass(NotSupported, PlanError)


def test_syntax_error() -> None:
    message = error_of("SELEC id FROM cells")
    assert "SELEC" in message and "hint: check the SQL syntax" in message


def test_unknown_table_lists_the_known_ones() -> None:
    with pytest.raises(UnknownTable):
        decompose("SELECT * FROM nope", TABLES)
    message = error_of("SELECT * FROM nope")
    assert "nope" in message and "not found" in message
    assert "lab.cells" in message and "cells" in message


def test_ambiguous_bare_name_is_not_registered() -> None:
    # "genes" exists in two domains: only the qualified names work.
    assert "not found" in error_of("SELECT * FROM genes")
    decompose("SELECT * FROM lab.genes JOIN other.genes USING (gene)", TABLES)


def test_unknown_column() -> None:
    message = error_of("SELECT nope FROM cells")
    assert "No field named nope" in message and "hint: check the column name" in message


def test_type_error() -> None:
    message = error_of("SELECT id + gene FROM cells")
    assert "hint: convert one side explicitly" in message


def test_statements_that_change_state_are_refused() -> None:
    assert error_of("CREATE TABLE x AS SELECT 1")
    assert error_of("DROP TABLE cells")


def test_bad_arguments() -> None:
    with pytest.raises(InvalidPushdown, match="pushdown must be one of never, always"):
        decompose("SELECT 1", TABLES, pushdown="sometimes")
    assert "unknown capabilities" in error_of("SELECT 1", capabilities={"lab/cells": "magic"})
    assert "unknown dataset" in error_of("SELECT 1", capabilities={"lab/nope": "full"})
    with pytest.raises(PlanError, match="domain/name"):
        decompose("SELECT 1", {"cells": TABLES["lab/cells"]})
    with pytest.raises(PlanError, match="reserved"):
        decompose("SELECT 1", {"lab/__quarry_fragment_0": TABLES["lab/cells"]})
