"""Help texts read as prose: a docstring's source line breaks are not the terminal's."""

from __future__ import annotations

from typer.testing import CliRunner

from quarry.cli import app
from quarry.cli_common import reflowed


def _help(*command: str, columns: int) -> list[str]:
    shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": str(columns)})
    assert shown.exit_code == 0, shown.output
    return shown.output.splitlines()


def test_the_command_list_wraps_where_the_terminal_ends():
    """`up`'s summary spans three source lines; on a wide terminal it is one row."""
    rows = _help(columns=200)
    [up] = [row for row in rows if row.startswith("│ up ")]
    assert "every call carries a token (the cluster's credentials are made in the data" in up
    assert "owner-readable only). With --servers" in up, up


def test_a_commands_own_help_wraps_where_the_terminal_ends():
    rows = _help("run", columns=200)
    assert any(
        "pd.read_csv) are answered from the devices; anything else reads the file system." in row
        for row in rows
    ), "\n".join(rows)
    at_80 = _help("run", columns=80)
    assert max(len(row) for row in at_80) <= 80
    # the second paragraph's first row runs on past the source's line break
    prose = [row.strip() for row in at_80 if row.startswith(" ") and row.strip()]
    assert "pd.read_csv) are answered from the devices; anything else reads the file" in prose


def test_an_example_or_a_list_keeps_its_lines():
    text = "One sentence\nacross two lines.\n\n    quarry up\n    quarry down\n\n- one\n- two"
    assert reflowed(text) == (
        "One sentence across two lines.\n\n    quarry up\n    quarry down\n\n- one\n- two"
    )
