"""A particle-simulation dump like the VPIC output of Kinetic Pipe: id, position, kinetic energy.

Kinetic energy follows a log-normal distribution, so "ke > X" selects any fraction of the rows
the experiments need; ``ke_threshold(fraction)`` gives the X for a wanted selectivity.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from scipy.special import ndtri

KE_MU = 0.0
KE_SIGMA = 1.0
BATCH_ROWS = 1 << 20

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("x", pa.float64(), nullable=False),
        pa.field("y", pa.float64(), nullable=False),
        pa.field("z", pa.float64(), nullable=False),
        pa.field("ke", pa.float64(), nullable=False),
    ]
)


def batches(rows: int, seed: int = 7, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    assert rows >= 0 and batch_rows > 0
    generator = np.random.default_rng(seed)
    for start in range(0, rows, batch_rows):
        n = min(batch_rows, rows - start)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(np.arange(start, start + n, dtype=np.int64)),
                pa.array(generator.uniform(0.0, 100.0, n)),
                pa.array(generator.uniform(0.0, 100.0, n)),
                pa.array(generator.uniform(0.0, 100.0, n)),
                pa.array(generator.lognormal(KE_MU, KE_SIGMA, n)),
            ],
            schema=SCHEMA,
        )


def reader(rows: int, seed: int = 7) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_batches(SCHEMA, batches(rows, seed))


def table(rows: int, seed: int = 7) -> pa.Table:
    return pa.Table.from_batches(list(batches(rows, seed)), schema=SCHEMA)


def ke_threshold(fraction: float) -> float:
    """X such that about ``fraction`` of the rows have ke > X."""
    assert 0 < fraction <= 1
    if fraction >= 1:
        return 0.0
    return math.exp(KE_MU + KE_SIGMA * float(ndtri(1.0 - fraction)))
