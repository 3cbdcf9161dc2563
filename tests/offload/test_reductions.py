"""Recognised reductions: each one's partials, computed on pieces of the rows and combined,
give what the line gives on all of them (pandas' layout and order, values to rounding)."""

from __future__ import annotations

import ast

import numpy as np
import pandas as pd
import pytest

from quarry.offload import reductions, values
from quarry.offload.reductions import recognise

RNG = np.random.default_rng(1)
FRAME = pd.DataFrame(
    {
        "g": RNG.integers(0, 5, 1_000),
        "h": RNG.choice(["x", "y", "z"], 1_000),
        "v": RNG.normal(size=1_000),
        "n": RNG.integers(0, 100, 1_000),
    }
)
FRAME.loc[5, "v"] = np.nan
MATRIX = FRAME[["v", "n"]].fillna(0).to_numpy()
PIECES = [(0, 300), (300, 301), (301, 301), (301, 1_000)]  # one of a row, one empty

LINES = [
    ("t = df.v.sum()", "Fold"),
    ("t = df[['v', 'n']].sum()", "Fold"),
    ("t = len(df)", "Fold"),
    ("t = df.n.min()", "Fold"),
    ("t = df[['v', 'n']].max()", "Fold"),
    ("t = df.v.mean()", "Mean"),
    ("t = df[['v', 'n']].mean()", "Mean"),
    ("t = df.v.var()", "Var"),
    ("t = df[['v', 'n']].std(ddof=0)", "Var"),
    ("t = df.h.value_counts()", "Counts"),
    ("t = df[['g', 'h']].value_counts()", "Counts"),
    ("t = df.groupby('g').v.sum()", "GroupBy"),
    (
        "t = df.groupby(['g', 'h']).agg(s=('v', 'sum'), m=('n', 'mean'), c=('v', 'count'))",
        "GroupBy",
    ),
    ("t = df.groupby('h')['v'].agg(['sum', 'mean', 'max'])", "GroupBy"),
    ("t = df.groupby('g').agg({'v': 'mean', 'n': ['min', 'max']})", "GroupBy"),
    ("t = df.groupby('g', sort=False).size()", "GroupBy"),
    ("t = df.groupby('h')[['v', 'n']].agg('sum')", "GroupBy"),
    ("t = np.bincount(df.g.to_numpy())", "Fold"),
    ("t = a.T @ a", "Fold"),
    ("t = np.sum(a, axis=0)", "Fold"),
]


@pytest.mark.parametrize(("text", "kind"), LINES)
def test_partials_combine_to_the_whole(text, kind):
    reduction = recognise(ast.parse(text).body[0])
    assert type(reduction).__name__ == kind
    whole: dict = {}
    exec(text, {"df": FRAME, "np": np, "a": MATRIX}, whole)
    parts = []
    for start, end in PIECES:
        namespace = {"df": FRAME.iloc[start:end], "np": np, "a": MATRIX[start:end]}
        namespace[reductions.HELPERS] = reductions
        part = eval(reduction.partial, namespace)
        parts.append(tuple(values.decode(values.encode(p)) for p in part))  # over the wire
    combined = reduction.combine(parts)
    expected = whole["t"]
    if isinstance(expected, pd.DataFrame):
        pd.testing.assert_frame_equal(combined, expected, check_exact=False, rtol=1e-9)
    elif isinstance(expected, pd.Series):
        pd.testing.assert_series_equal(combined, expected, check_exact=False, rtol=1e-9)
    elif isinstance(expected, np.ndarray):
        assert combined.dtype == expected.dtype
        np.testing.assert_allclose(combined, expected, rtol=1e-9)
    else:
        assert combined == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "text",
    [
        "t = df.v.sum() / 2",  # not outermost
        "t = df.groupby(df.g % 2).v.sum()",  # a computed key
        "t = df.groupby('g').v.median()",  # not decomposable
        "t = df.v.value_counts(normalize=True)",
        "t = df.v.sum(axis=1)",
        "df.v.sum()",  # binds nothing
    ],
)
def test_other_lines_are_not_reductions(text):
    assert recognise(ast.parse(text).body[0]) is None


@pytest.mark.parametrize(
    "value",
    [
        FRAME,
        FRAME.v,
        FRAME.set_index(["g", "h"]),
        MATRIX,
        np.int64(3),
        2.5,
        "text",
        None,
        FRAME.groupby("g").n.sum(),
    ],
)
def test_values_travel_as_arrow_and_come_back_equal(value):
    back = values.decode(values.encode(value))
    if isinstance(value, pd.DataFrame):
        pd.testing.assert_frame_equal(back, value)
    elif isinstance(value, pd.Series):
        pd.testing.assert_series_equal(back, value)
    elif isinstance(value, np.ndarray):
        np.testing.assert_array_equal(back, value)
    else:
        assert back == value and type(back) is type(value)


def test_an_object_the_program_made_does_not_travel():
    with pytest.raises(values.CannotTravel):
        values.encode(object())
