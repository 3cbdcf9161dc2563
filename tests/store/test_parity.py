"""The stripe code (``store/parity.py``): any K of K+M blocks give the data back, exactly, for
values of unequal lengths; the redundancy text is parsed or refused by name."""

from __future__ import annotations

import itertools
import random

import pytest

from quarry.errors import CorruptSlice, InvalidOption
from quarry.store import parity


@pytest.mark.parametrize(("k", "m"), [(2, 1), (4, 2), (8, 2)])
def test_any_k_blocks_give_back_every_value(k, m):
    rng = random.Random(k * 10 + m)
    values = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(k)]
    values[-1] = b""  # a partition with no slice at this number
    code = parity.Code(k, m)
    blocks, length = parity.encode(code, values)
    assert len(blocks) == m and all(len(b) == length for b in blocks)
    every = dict(enumerate([*values, *blocks]))
    for lost in itertools.combinations(range(k + m), m):
        kept = {n: block for n, block in every.items() if n not in lost}
        data = parity.decode(code, kept, length)
        assert [d[: len(v)] for d, v in zip(data, values, strict=True)] == values


def test_fewer_than_k_blocks_is_a_clear_error():
    code = parity.Code(4, 2)
    blocks, length = parity.encode(code, [b"a" * 10] * 4)
    with pytest.raises(CorruptSlice, match="3 blocks of a stripe survive; 4 are needed"):
        parity.decode(code, {0: b"a" * 10, 1: b"a" * 10, 4: blocks[0]}, length)


def test_redundancy_text():
    assert parity.parse("") is None and parity.parse("replicas") is None
    assert parity.parse("ec:8+2") == parity.Code(8, 2)
    assert parity.Code(8, 2).overhead == 1.25 and parity.Code(4, 2).text == "ec:4+2"
    for bad in ("ec:4", "raid6", "ec:0+1", "ec:4+0", "ec:40+2"):
        with pytest.raises(InvalidOption):
            parity.parse(bad)


@pytest.mark.parametrize(("k", "m"), [(2, 1), (4, 2), (8, 2)])
def test_a_byte_range_of_k_blocks_decodes_that_range_of_the_data(k, m):
    """The code works byte by byte: a degraded read of one column rebuilds only its bytes
    from the same range of the survivors (``reads/degraded.py``)."""
    rng = random.Random(k * 100 + m)
    values = [rng.randbytes(rng.randrange(1000, 3000)) for _ in range(k)]
    code = parity.Code(k, m)
    blocks, length = parity.encode(code, values)
    padded = [v + bytes(length - len(v)) for v in values]
    every = dict(enumerate([*padded, *blocks]))
    low, high = sorted(rng.sample(range(length), 2))
    for lost in itertools.combinations(range(k + m), m):
        kept = {n: block[low:high] for n, block in every.items() if n not in lost}
        assert parity.decode(code, kept, high - low) == [v[low:high] for v in padded]
