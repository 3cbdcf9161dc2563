"""What every quarry command line shares: finding the cluster, printing, and failing.

`quarry` (cli.py), `quarry de` (genes/cli.py) and `quarry capacity` (capacity/cli.py) each run on
their own too (`python -m quarry.genes.cli`, `python -m quarry.capacity.cli`), so they cannot
borrow from one another without import circles: the main CLI mounts the other two. What they
have in common lives here, and this module imports none of them:

- `ClusterOption`, `cluster_file`, `open_cluster`: one `--cluster FILE` option, found the same
  way by every command (the option, else $QUARRY_CLUSTER, else `.quarry/cluster.json`);
- `console`, `human_bytes`, `JsonOption`, `print_json`: one console and one way to print sizes
  and JSON;
- `ReflowedHelp`: help texts that read as prose at any terminal width;
- `user_errors`, `run`: a `QuarryError` (or another error a command names as the user's) becomes
  one red line on stderr and exit code `EXIT_USER_ERROR`, never a traceback; under `run`, any
  other error is an `InternalError`: one red line, its traceback in a file, exit code `EXIT_BUG`.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from quarry import settings
from quarry.errors import InternalError, QuarryError, only_quarry_errors
from quarry.errors import log as internal_log

if TYPE_CHECKING:
    from quarry.coordinator.cluster import Cluster

DEFAULT_DATA = ".quarry"
# Exit code 2 is what click gives a wrong option, and what quarry has always given an error the
# user can fix: scripts tell these apart from a crash (1) or Ctrl-C (130).
EXIT_USER_ERROR = 2
EXIT_BUG = 1  # what Python gives an uncaught exception: quarry's own failure
EXIT_INTERRUPTED = 130

ClusterOption = Annotated[
    Path | None,
    typer.Option(
        "--cluster",
        help=f"cluster file (default: ${settings.CLUSTER.name} or {settings.CLUSTER.default})",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]

console = Console()
errors = Console(stderr=True)


def cluster_file(path: Path | None) -> Path:
    """The cluster file a command uses: `--cluster`, else $QUARRY_CLUSTER, else the default."""
    if path is not None:
        return path
    return settings.CLUSTER.get()


def open_cluster(path: Path | None) -> Cluster:
    # Imported here: the coordinator pulls in Flight and DataFusion, which commands that never
    # touch a cluster (capacity bep, --help) should not pay for.
    from quarry.coordinator.cluster import connect

    return connect(cluster_file(path))


def human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value}"


def pushed_back_words(by: Mapping[str, int]) -> str:
    """Slices pushed back, in all and per reason: "pushed back 12 (busy 8, capability 4)"."""
    reasons = ", ".join(f"{reason} {slices:,}" for reason, slices in by.items() if slices)
    return f"pushed back {sum(by.values()):,} ({reasons})"


class ReflowedHelp(TyperGroup):
    """A command group whose help, and every command's under it, reads as prose: a docstring's
    line breaks are where its source line ended, not where a sentence does, and typer keeps
    them (all of them in the command list, those after the first paragraph in a command's own
    help). Built once, when the group is, so the one ``cls=ReflowedHelp`` on the top app
    covers every command and sub-group mounted on it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _reflow_command(self)


def _reflow_command(command: Any) -> None:
    command.help = reflowed(command.help)
    for parameter in command.params:
        if isinstance(getattr(parameter, "help", None), str):
            parameter.help = reflowed(parameter.help)
    for sub in getattr(command, "commands", {}).values():
        _reflow_command(sub)


def reflowed(text: str | None) -> str | None:
    """Paragraphs joined into one line each, for the terminal to wrap. A paragraph that is
    laid out on purpose stays as written: click's no-rewrap mark (\\b), indented lines (an
    example) and lists."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        paragraph if _laid_out(paragraph) else " ".join(paragraph.split("\n"))
        for paragraph in paragraphs
    )


def _laid_out(paragraph: str) -> bool:
    lines = paragraph.split("\n")
    return paragraph.startswith("\b") or any(
        line.startswith((" ", "\t", "- ", "* ", "$ ")) for line in lines
    )


def print_json(value: Any, output: Path | None = None) -> None:
    """Indented JSON on stdout, or into ``output``; values JSON lacks (paths, times) as text."""
    text = json.dumps(value, indent=2, default=str)
    if output is not None:
        output.write_text(text)
    else:
        sys.stdout.write(text + "\n")


def report_error(error: BaseException) -> None:
    """One red line on stderr. The message is printed as text (not rich markup, which would eat
    brackets in it) and not wrapped, so `grep` finds it whole."""
    errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)


@contextmanager
def user_errors(*also: type[Exception]) -> Iterator[None]:
    """Inside a command: a `QuarryError` or one of ``also`` ends it with one red line and
    `EXIT_USER_ERROR`. For apps that run under typer's test runner, where `run` is not."""
    try:
        yield
    except (QuarryError, *also) as error:
        report_error(error)
        raise typer.Exit(code=EXIT_USER_ERROR) from None


class TraceFile(logging.Handler):
    """Where the command's internal errors leave their tracebacks (``errors.internal`` logs
    them): a file made when the first comes, named on the console, which keeps one line."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.path: Path | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.path is None:
            descriptor, name = tempfile.mkstemp(prefix="quarry-error-", suffix=".log")
            os.close(descriptor)
            self.path = Path(name)
        with self.path.open("a") as file:
            file.write(self.format(record) + "\n")


def run(app: typer.Typer) -> None:
    """The entry point of a quarry command line: an error the user can act on is one red line
    and `EXIT_USER_ERROR`, never a traceback. Anything else is a bug: it becomes an
    ``InternalError``, one red line too, with the file that holds its traceback, and
    `EXIT_BUG`."""
    trace = TraceFile()
    logging.getLogger(internal_log.name).addHandler(trace)
    try:
        with only_quarry_errors():
            app()
    except InternalError as error:
        if trace.path is None:  # not logged where it was raised
            internal_log.error("internal error", exc_info=error)
        report_error(error)
        errors.print(f"traceback: {trace.path}", highlight=False, soft_wrap=True, markup=False)
        raise SystemExit(EXIT_BUG) from None
    except QuarryError as error:
        report_error(error)
        raise SystemExit(EXIT_USER_ERROR) from None
    except KeyboardInterrupt:
        raise SystemExit(EXIT_INTERRUPTED) from None
