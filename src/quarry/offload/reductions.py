"""Recognised reductions: a line that folds many rows into few runs on the devices as partials,
and the host combines them (ActivePy §III.B; DESIGN §4).

A line ``name = EXPR`` whose outermost operation is one of these is a reduction:

- ``.sum()``, ``.count()``, ``.min()``, ``.max()``, ``len(x)``, ``np.sum``, ``np.bincount``,
  ``a.T @ b`` / ``.dot`` (a matrix product's partial sums): each part computes the line as
  written; the host adds them (or takes their least, greatest) — ``Fold``;
- ``.mean()``: sums and counts — ``Mean``; ``.var()`` / ``.std()``: counts, means and sums of
  squared deviations, merged pairwise (Chan et al.) — ``Var``;
- ``.value_counts()``: counts per value, added, ordered as pandas orders them — ``Counts``;
- ``df.groupby(keys)[cols].<sum|count|min|max|mean|size|agg>(...)`` with those functions, in
  any of pandas' spellings (a list, a dict, named aggregation) — ``GroupBy``.

Each has ``partial``: the Python expression a device evaluates, in the program's namespace, in
place of the line (it gives a tuple of parts), and ``combine``: what the host does with every
part, in the source's order. A reduction is used only when, on the samples, its parts combine
to what the line gives on the whole (``partitions.py`` checks it), so a spelling this module
misreads stays on the host rather than giving a wrong answer.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HELPERS = "__quarry__"  # the name this module has in a device's namespace


@dataclass(frozen=True)
class Reduction:
    """A recognised reduction: the name it binds and what devices evaluate instead."""

    target: str
    partial: str  # an expression giving a tuple of parts

    def combine(self, parts: Sequence[tuple]) -> Any:
        raise NotImplementedError


# ---- plain folds ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fold(Reduction):
    op: str = "+"  # "+", "min" or "max"

    def combine(self, parts: Sequence[tuple]) -> Any:
        values = [p[0] for p in parts]
        if self.op == "+":
            return functools.reduce(_add, values)
        return _extreme(values, self.op)


def _add(left: Any, right: Any) -> Any:
    arrays = isinstance(left, np.ndarray) and isinstance(right, np.ndarray)
    if arrays and left.shape != right.shape and left.ndim == right.ndim == 1:
        size = max(len(left), len(right))  # bincount without minlength: the longest
        return _padded(left, size) + _padded(right, size)
    return left + right


def _padded(array: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([array, np.zeros(size - len(array), dtype=array.dtype)])


def _missing(value: Any) -> bool:
    try:
        return value is None or bool(value != value)
    except (TypeError, ValueError):
        return False


def _extreme(values: list[Any], op: str) -> Any:
    import pandas as pd

    if all(isinstance(v, pd.Series) for v in values):
        together = pd.concat(values, axis=1)
        result = together.min(axis=1) if op == "min" else together.max(axis=1)
        result.name = values[0].name
        dtypes = {v.dtype for v in values}
        if len(dtypes) == 1 and not result.isna().any():
            result = result.astype(values[0].dtype)
        return result
    if all(isinstance(v, np.ndarray) for v in values):
        return functools.reduce(np.minimum if op == "min" else np.maximum, values)
    present = [v for v in values if not _missing(v)]
    if not present:
        return values[0]
    return min(present) if op == "min" else max(present)


# ---- mean, variance ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mean(Reduction):
    @staticmethod
    def part(values: Any) -> tuple:
        if isinstance(values, np.ndarray):
            return (values.sum(), values.size)
        return (values.sum(), values.count())

    def combine(self, parts: Sequence[tuple]) -> Any:
        total = functools.reduce(_add, [p[0] for p in parts])
        count = functools.reduce(_add, [p[1] for p in parts])
        with np.errstate(invalid="ignore", divide="ignore"):
            if isinstance(count, int | np.integer) and count == 0:
                return float("nan")
            return total / count


@dataclass(frozen=True)
class Var(Reduction):
    ddof: int = 1
    root: bool = False  # std

    @staticmethod
    def part(values: Any) -> tuple:
        if isinstance(values, np.ndarray):
            count = values.size
            mean = values.mean() if count else 0.0
            return (count, mean, float(((values - mean) ** 2).sum()))
        count = values.count()
        mean = values.mean()
        squares = ((values - mean) ** 2).sum()
        if hasattr(mean, "fillna"):
            return (count, mean.fillna(0.0), squares.fillna(0.0))
        return (count, 0.0 if count == 0 else mean, 0.0 if count == 0 else squares)

    def combine(self, parts: Sequence[tuple]) -> Any:
        count, mean, squares = parts[0]
        for n_b, mean_b, squares_b in parts[1:]:
            total = count + n_b
            with np.errstate(invalid="ignore", divide="ignore"):
                delta = mean_b - mean
                weight = _safe_ratio(n_b, total)
                mean = mean + delta * weight
                squares = squares + squares_b + delta * delta * count * weight
            count = total
        with np.errstate(invalid="ignore", divide="ignore"):
            if hasattr(count, "where"):
                variance = (squares / (count - self.ddof)).where(count - self.ddof > 0)
            else:
                variance = squares / (count - self.ddof) if count > self.ddof else float("nan")
        return variance**0.5 if self.root else variance


def _safe_ratio(part: Any, total: Any) -> Any:
    if hasattr(total, "where"):
        return (part / total.where(total > 0)).fillna(0.0)
    return part / total if total else 0.0


# ---- value counts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts(Reduction):
    sort: bool = True
    ascending: bool = False

    @staticmethod
    def part(values: Any, dropna: bool = True) -> tuple:
        return (values.value_counts(sort=False, dropna=dropna),)

    def combine(self, parts: Sequence[tuple]) -> Any:
        import pandas as pd

        together = pd.concat([p[0] for p in parts])
        levels = list(range(together.index.nlevels))
        counts = together.groupby(level=levels, sort=False, dropna=False).sum()
        counts.name = parts[0][0].name
        # first appearance in the source's order, then pandas' own sort: the plain run's order
        return counts.sort_values(ascending=self.ascending) if self.sort else counts


# ---- group-by aggregates -------------------------------------------------------------------------

# what each function needs of a part, and how parts of it add up
PARTS = {
    "sum": ("sum",),
    "count": ("count",),
    "min": ("min",),
    "max": ("max",),
    "mean": ("sum", "count"),
    "size": ("size",),
}
COMBINE = {"sum": "sum", "count": "sum", "size": "sum", "min": "min", "max": "max"}


@dataclass(frozen=True)
class GroupBy(Reduction):
    sort: bool = True
    dropna: bool = True

    @staticmethod
    def part(frame: Any, keys: Any, selection: Any, spec: str, dropna: bool = True) -> tuple:
        """Per group, the parts each output needs; and the layout (which outputs, what shape)."""
        import pandas as pd

        keys = list(keys) if isinstance(keys, list | tuple) else [keys]
        method, args, kwargs = json.loads(spec)
        layout = _layout(frame, keys, selection, method, args, kwargs)
        pairs = sorted({(column, p) for _, column, f in layout["outputs"] for p in PARTS[f]})
        grouped = frame.groupby(keys, sort=False, dropna=dropna)
        columns = {}
        for position, (column, part) in enumerate(pairs):
            values = grouped.size() if part == "size" else getattr(grouped[column], part)()
            columns[str(position)] = values
        layout["pairs"] = pairs
        return (pd.DataFrame(columns), json.dumps(layout))

    def combine(self, parts: Sequence[tuple]) -> Any:
        import pandas as pd

        layout = json.loads(parts[0][1])
        pairs = [tuple(p) for p in layout["pairs"]]
        together = pd.concat([p[0] for p in parts])
        grouped = together.groupby(
            level=list(range(together.index.nlevels)), sort=self.sort, dropna=self.dropna
        )
        combined = grouped.agg({str(i): COMBINE[part] for i, (_, part) in enumerate(pairs)})

        def value(column: Any, function: str) -> Any:
            if function == "mean":
                total = combined[str(pairs.index((column, "sum")))]
                return total / combined[str(pairs.index((column, "count")))]
            return combined[str(pairs.index((column, PARTS[function][0])))]

        outputs = [(_label(label), column, f) for label, column, f in layout["outputs"]]
        if layout["form"] == "series":
            series = value(outputs[0][1], outputs[0][2])
            series.name = outputs[0][0]
            return series
        frame = pd.DataFrame({i: value(column, f) for i, (_, column, f) in enumerate(outputs)})
        labels = [label for label, _, _ in outputs]
        if any(isinstance(label, tuple) for label in labels):
            frame.columns = pd.MultiIndex.from_tuples(labels)
        else:
            frame.columns = pd.Index(labels)
        return frame


def _label(label: Any) -> Any:
    return tuple(label) if isinstance(label, list) else label


def _layout(
    frame: Any, keys: list[Any], selection: Any, method: str, args: list, kwargs: dict
) -> dict[str, Any]:
    """The outputs pandas would give, as (label, column, function), and their shape."""
    series = isinstance(selection, str)
    if series:
        columns = [selection]
    elif selection is not None:
        columns = list(selection)
    else:
        columns = [c for c in frame.columns if c not in keys]
    if method == "size":
        return {"form": "series", "outputs": [[selection if series else None, None, "size"]]}
    if method != "agg":
        args, method = [method], "agg"
    if kwargs:  # named aggregation
        if series:
            return {"form": "frame", "outputs": [[k, selection, f] for k, f in kwargs.items()]}
        return {"form": "frame", "outputs": [[k, c, f] for k, (c, f) in kwargs.items()]}
    (spec,) = args
    if isinstance(spec, str):
        if series:
            return {"form": "series", "outputs": [[selection, selection, spec]]}
        return {"form": "frame", "outputs": [[c, c, spec] for c in columns]}
    if isinstance(spec, list):
        if series:
            return {"form": "frame", "outputs": [[f, selection, f] for f in spec]}
        return {"form": "frame", "outputs": [[[c, f], c, f] for c in columns for f in spec]}
    if isinstance(spec, dict):
        if all(isinstance(f, str) for f in spec.values()):
            return {"form": "frame", "outputs": [[c, c, f] for c, f in spec.items()]}
        spelled = {c: [f] if isinstance(f, str) else list(f) for c, f in spec.items()}
        outputs = [[[c, f], c, f] for c, fs in spelled.items() for f in fs]
        return {"form": "frame", "outputs": outputs}
    raise TypeError(f"an aggregation spelled {spec!r}")


# ---- recognising them ----------------------------------------------------------------------------

FOLDS = {"sum": "+", "count": "+", "min": "min", "max": "max", "dot": "+"}
NUMPY_FOLDS = {
    "sum": "+",
    "bincount": "+",
    "dot": "+",
    "matmul": "+",
    "min": "min",
    "amin": "min",
    "max": "max",
    "amax": "max",
}
GROUP_METHODS = frozenset({"sum", "count", "min", "max", "mean", "size", "agg", "aggregate"})


def recognise(statement: ast.stmt) -> Reduction | None:
    """The reduction a statement is, or None."""
    if not (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
    ):
        return None
    target, value = statement.targets[0].id, statement.value
    text = ast.unparse(value)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.MatMult):
        return Fold(target, f"({text},)", "+")
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Name):
        return Fold(target, f"({text},)", "+") if func.id == "len" else None
    if not isinstance(func, ast.Attribute):
        return None
    receiver = func.value
    if isinstance(receiver, ast.Name) and receiver.id in ("np", "numpy"):
        op = NUMPY_FOLDS.get(func.attr)
        keywords = {k.arg for k in value.keywords}
        if op is None or keywords - {"minlength", "axis"} or _axis_not_rows(value):
            return None
        return Fold(target, f"({text},)", op)
    if _grouped(receiver) is not None and func.attr in GROUP_METHODS:
        return _group_by(target, value)
    return _method(target, value, func.attr, ast.unparse(receiver))


def _axis_not_rows(call: ast.Call) -> bool:
    for keyword in call.keywords:
        if keyword.arg == "axis":
            return not (isinstance(keyword.value, ast.Constant) and keyword.value.value == 0)
    return False


def _method(target: str, call: ast.Call, name: str, receiver: str) -> Reduction | None:
    options = _literals(call)
    if options is None:
        return None
    args, kwargs = options
    text = ast.unparse(call)
    if name in FOLDS and not args and not (set(kwargs) - {"axis"}) and not _axis_not_rows(call):
        return Fold(target, f"({text},)", FOLDS[name])
    if name == "mean" and not args and not kwargs:
        return Mean(target, f"{HELPERS}.Mean.part({receiver})")
    if name in ("var", "std") and not args and not (set(kwargs) - {"ddof"}):
        return Var(target, f"{HELPERS}.Var.part({receiver})", kwargs.get("ddof", 1), name == "std")
    if name == "value_counts" and not args and not (set(kwargs) - {"sort", "ascending", "dropna"}):
        dropna = kwargs.get("dropna", True)
        partial = f"{HELPERS}.Counts.part({receiver}, {dropna!r})"
        return Counts(target, partial, kwargs.get("sort", True), kwargs.get("ascending", False))
    return None


def _grouped(node: ast.expr) -> tuple[ast.Call, ast.expr | None] | None:
    """``X.groupby(...)`` or ``X.groupby(...)[sel]``: (the groupby call, the selection)."""
    selection: ast.expr | None = None
    if isinstance(node, ast.Subscript):
        node, selection = node.value, node.slice
    elif isinstance(node, ast.Attribute) and _grouped(node.value) is not None:
        node, selection = node.value, ast.Constant(node.attr)  # df.groupby(k).x
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "groupby"
    ):
        return node, selection
    return None


def _group_by(target: str, call: ast.Call) -> Reduction | None:
    grouped, selection = _grouped(call.func.value)
    options = _literals(call)
    group_options = _literals(grouped)
    if options is None or group_options is None or len(grouped.args) != 1:
        return None
    (key_args, group_kwargs) = group_options
    group_kwargs = dict(group_kwargs)
    if group_kwargs.pop("by", None) is not None or set(group_kwargs) - {"sort", "dropna"}:
        return None
    method = "agg" if call.func.attr == "aggregate" else call.func.attr
    args, kwargs = options
    if method != "agg" and (args or kwargs):
        return None
    functions = _functions(method, args, kwargs)
    if functions is None or not functions <= set(PARTS):
        return None
    spec = json.dumps([method, args, kwargs])
    chosen = "None" if selection is None else ast.unparse(selection)
    dropna = group_kwargs.get("dropna", True)
    partial = (
        f"{HELPERS}.GroupBy.part({ast.unparse(grouped.func.value)}, "
        f"{ast.unparse(grouped.args[0])}, {chosen}, {spec!r}, {dropna!r})"
    )
    return GroupBy(target, partial, group_kwargs.get("sort", True), dropna)


def _functions(method: str, args: list, kwargs: dict) -> set[str] | None:
    if method != "agg":
        return {method}
    if kwargs and not args:
        found = set()
        for value in kwargs.values():
            if isinstance(value, str):
                found.add(value)
            elif isinstance(value, list | tuple) and len(value) == 2:
                found.add(value[1])
            else:
                return None
        return found
    if len(args) != 1 or kwargs:
        return None
    (spec,) = args
    if isinstance(spec, str):
        return {spec}
    if isinstance(spec, list) and all(isinstance(f, str) for f in spec):
        return set(spec)
    if isinstance(spec, dict):
        found = set()
        for value in spec.values():
            found |= {value} if isinstance(value, str) else set(value)
        return found
    return None


def _literals(call: ast.Call) -> tuple[list, dict] | None:
    """A call's arguments when every one is a literal (a string, a list ...), else None."""
    try:
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    except ValueError:
        return None
    if any(k.arg is None for k in call.keywords):
        return None
    return args, kwargs


__all__ = ["HELPERS", "Counts", "Fold", "GroupBy", "Mean", "Reduction", "Var", "recognise"]
