"""checks.check: what a slice read off the store must satisfy before an engine sees it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from quarry.store import checks


def _strings(offsets: list[int], data: bytes, kind: pa.DataType = pa.string()) -> pa.Array:
    width = np.int64 if kind in (pa.large_string(), pa.large_binary()) else np.int32
    buffers = [None, pa.py_buffer(np.array(offsets, dtype=width).tobytes()), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, len(offsets) - 1, buffers)


def _batch(column: pa.Array) -> pa.RecordBatch:
    return pa.record_batch([column], names=["c"])


@pytest.mark.parametrize("kind", [pa.string(), pa.binary(), pa.large_string(), pa.large_binary()])
def test_offsets_past_the_data_or_going_back_are_refused(kind) -> None:
    checks.check(_batch(_strings([0, 2, 5], b"abcde", kind)))
    with pytest.raises(pa.ArrowInvalid):
        checks.check(_batch(_strings([0, 2, 9], b"abcde", kind)))
    with pytest.raises(pa.ArrowInvalid):
        checks.check(_batch(_strings([0, 4, 2, 5], b"abcde", kind)))


def test_text_must_be_utf8_and_non_ascii_utf8_passes() -> None:
    checks.check(_batch(pa.array(["grüße", "名前", ""])))
    with pytest.raises(pa.ArrowInvalid):
        checks.check(_batch(_strings([0, 2, 4], b"a\xff\xfeb")))
    checks.check(_batch(_strings([0, 2, 4], b"a\xff\xfeb", pa.binary())))  # bytes are bytes


def test_a_slice_of_an_array_is_checked_within_its_window() -> None:
    column = pa.array(["a", "bb", "ccc", "dddd"]).slice(1, 2)
    checks.check(_batch(column))


def test_nested_columns_get_the_full_check() -> None:
    checks.check(_batch(pa.array([["a", "b"], ["c"]], pa.list_(pa.string()))))
    offsets = pa.py_buffer(np.array([0, 1, 2], dtype=np.int32).tobytes())
    text = _strings([0, 2, 4], b"a\xff\xfeb")  # passes Arrow's basic validation
    nested = pa.ListArray.from_buffers(pa.list_(pa.string()), 2, [None, offsets], children=[text])
    with pytest.raises(pa.ArrowInvalid):
        checks.check(_batch(nested))


def test_fixed_width_columns_pass_on_their_buffer_sizes() -> None:
    checks.check(
        pa.record_batch(
            [
                pa.array([1.5, None]),
                pa.array([1, 2], pa.decimal128(15, 2)),
                pa.array([True, False]),
            ],
            names=["f", "d", "b"],
        )
    )
