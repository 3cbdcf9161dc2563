"""A sample of a dataset: every k-th row of every slice, counted from the slice's first row.

Defined per slice so that it is the same rows wherever it runs: a device that pushes a slice
back ships it raw and the host takes the same rows of it. A sample is what a program's sampling
phase reads (ActivePy §III.A: the same program on a fraction of its input).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from quarry.device.unit import Chunk, Unit, register
from quarry.protocol.message import Message, bounded
from quarry.protocol.stage import Stage

EVERY_MAX = 1 << 30


@dataclass(frozen=True)
class SampleArgs(Message):
    every: int = bounded(low=1, high=EVERY_MAX)
    schema: pa.Schema  # the dataset's; the sample keeps every column


def every_kth(batch: pa.RecordBatch, every: int) -> pa.RecordBatch:
    return batch.take(pa.array(range(0, batch.num_rows, every), pa.int64()))


@register
class SampleUnit(Unit):
    NAME = "sample"
    STAGES = frozenset({Stage.FULL, Stage.RAW})
    RESUMABLE = True

    def __init__(self, request, payload, context):
        super().__init__(request, payload, context)
        self.args = SampleArgs.from_json(request.args)

    @property
    def output_schema(self) -> pa.Schema:
        return self.args.schema

    def execute(self, chunk: Chunk) -> list[pa.RecordBatch]:
        batches = list(chunk.batches())
        return self.context.compute(lambda: [every_kth(b, self.args.every) for b in batches])

    def complete(self, stage: Stage, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # a raw push back ships each slice as one batch: the same rows as on the device
        for batch in batches:
            yield every_kth(batch, self.args.every)
