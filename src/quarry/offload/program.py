"""A script as ActivePy sees it: a sequence of lines, each a single-entry single-exit region.

A line is one top-level statement (a loop or a function definition with its body is one line:
its inside runs as a whole wherever it runs). Each line knows the names it reads that an earlier
line bound (its inputs, whose bytes cross the link if it runs elsewhere than their maker) and
the names it binds (its outputs).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from quarry.errors import QuarryError


class ProgramError(QuarryError, ValueError):
    """A script that cannot be read as a program (a syntax error, a missing file)."""

    code = "program_error"


@dataclass(frozen=True)
class Line:
    number: int  # the statement's first line in the file
    text: str  # its source, as written
    code: object  # compiled, ready to exec
    reads: frozenset[str]  # names it loads
    binds: frozenset[str]  # names it stores
    pinned: bool = False  # it talks to the user or the file system: it runs on the host


@dataclass(frozen=True)
class Program:
    path: str
    lines: tuple[Line, ...]
    source: str = ""  # the whole text (what a device compiles its lines from)

    @classmethod
    def read(cls, path: str | Path) -> Program:
        file = Path(path)
        if not file.is_file():
            raise ProgramError(f"{str(file)!r}: no such script")
        return cls.parse(file.read_text(), str(file))

    @classmethod
    def parse(cls, source: str, path: str = "<program>") -> Program:
        try:
            tree = ast.parse(source, filename=path)
        except SyntaxError as error:
            raise ProgramError(f"{path}:{error.lineno}: {error.msg}") from None
        lines = []
        for statement in tree.body:
            module = ast.Module(body=[statement], type_ignores=[])
            lines.append(
                Line(
                    number=statement.lineno,
                    text=ast.get_source_segment(source, statement) or ast.unparse(statement),
                    code=compile(module, path, "exec"),
                    reads=frozenset(_names(statement, ast.Load)),
                    binds=frozenset(_bound(statement)),
                    pinned=_talks_outside(statement),
                )
            )
        return cls(path, tuple(lines), source)


# Calls whose effect is outside the program's values: the user's console, files, plots.
OUTSIDE_CALLS = frozenset(
    {
        "print",
        "open",
        "input",
        "write",
        "savefig",
        "show",
        "to_csv",
        "to_parquet",
        "to_json",
        "to_excel",
        "save",
        "savez",
        "dump",
    }
)


def _talks_outside(statement: ast.stmt) -> bool:
    for node in ast.walk(statement):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in OUTSIDE_CALLS:
                return True
    return False


def _names(node: ast.AST, context: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


def _bound(statement: ast.stmt) -> set[str]:
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {statement.name}  # its body's names are its own
    names = _names(statement, ast.Store)
    # df["x"] = ..., df.x = ..., df.loc[...] = ...: the frame itself changes
    targets = getattr(statement, "targets", None) or [getattr(statement, "target", None)]
    for target in targets:
        while isinstance(target, ast.Subscript | ast.Attribute):
            target = target.value
        if isinstance(target, ast.Name):
            names.add(target.id)
    if isinstance(statement, ast.Import | ast.ImportFrom):
        names |= {(a.asname or a.name).split(".")[0] for a in statement.names}
    # a method call on a name may change it in place (df.sort_values(inplace=True), list.append)
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            names.add(func.value.id)
    return names
