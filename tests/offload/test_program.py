"""A script as lines: each top-level statement, the names it reads and binds."""

from __future__ import annotations

import pytest

from quarry.offload.program import Program, ProgramError

SOURCE = """import pandas as pd
df = pd.read_parquet("data/t.parquet")
def twice(x):
    y = x * 2
    return y
df["k"] = twice(df.ke)
for c in ["a", "b"]:
    print(c)
df.sort_values("k", inplace=True)
"""


def test_each_top_level_statement_is_a_line_with_its_names():
    program = Program.parse(SOURCE, "s.py")
    assert [line.number for line in program.lines] == [1, 2, 3, 6, 7, 9]
    imports, read, define, assign, loop, sort = program.lines
    assert imports.binds == {"pd"}
    assert read.reads == {"pd"} and read.binds == {"df"}
    assert define.binds == {"twice"}  # not its locals
    assert assign.reads >= {"df", "twice"}
    assert assign.binds == {"df"}  # df["k"] = ...: the frame changes
    assert loop.text.startswith("for c in") and "print(c)" in loop.text
    assert "df" in sort.binds  # changed in place


def test_a_script_that_does_not_parse_names_file_and_line(tmp_path):
    with pytest.raises(ProgramError, match=r"s.py:2: "):
        Program.parse("x = 1\ny = (\n", "s.py")
    with pytest.raises(ProgramError, match="no such script"):
        Program.read(tmp_path / "missing.py")


def test_lines_that_print_or_write_files_are_pinned_to_the_host():
    program = Program.parse(
        "x = 1\nprint(x)\ndf.to_csv('out.csv')\ny = [v for v in range(3)]\n", "s.py"
    )
    assert [line.pinned for line in program.lines] == [False, True, True, False]
