"""In-process fuzz targets: every decoder a device runs and every reader ingest runs.

Seeds are valid inputs: a frame of every message, the Substrait stages of real queries, stored
slice values, and small files of every format ingest reads. Each mutated input goes to:

    frames        quarry.protocol: frame.decode and every message's checked decode
    substrait     a device's stage preparation and run (the substrait unit's ``_run``)
    slices        store.codec.decode_slice, the paired check of a slice against its metadata
    parquet, csv, arrow, h5ad, mtx    the ingest readers, read to the end
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from quarry.errors import ProtocolError

# A damaged HDF5 file that makes the library loop is stopped after this long when fuzzing (the
# reader's own default is generous, for large real files on slow disks).
HDF5_CHECK_S = 3.0


def decode_any_frame(data: bytes) -> None:
    """What a device does with a request: split the frame, then decode it as its kind says."""
    from quarry.protocol import control, frame, ingest, work
    from quarry.protocol.message import Message

    kinds = {
        cls.KIND: cls
        for module in (control, ingest, work)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, Message) and cls.KIND
    }
    kind, header, _ = frame.decode(data)
    if kind in kinds:
        kinds[kind].from_json(header)
    else:
        raise ProtocolError(f"unknown kind {kind!r}")  # as a device says it


def substrait_seeds() -> tuple[list[bytes], pa.Schema, list[pa.RecordBatch]]:
    """The stages of a few real queries, and rows to run them on."""
    from quarry.plan import decompose
    from quarry.protocol.stage import Stage

    table = pa.table({"id": pa.array(range(64), pa.int64()), "ke": [float(i) for i in range(64)]})
    stages = []
    for sql in (
        "SELECT sum(ke) FROM t WHERE ke > 3",
        "SELECT id, ke * 2 AS k FROM t WHERE id < 10 ORDER BY ke LIMIT 5",
        "SELECT id % 3 AS g, avg(ke), count(*) FROM t GROUP BY 1",
    ):
        for fragment in decompose(sql, {"test/t": table.schema}).fragments:
            stages += [fragment.stages[s] for s in (Stage.RAW, Stage.FILTER, Stage.FULL)]
    return stages, table.schema, table.to_batches()


def run_any_stage(schema: pa.Schema, batches: list[pa.RecordBatch]) -> Callable[[bytes], None]:
    """What a device does with stage bytes (units/substrait: its errors as the user sees them)."""
    from quarry.device.units.substrait import _run

    def target(data: bytes) -> None:
        for _ in _run(data, schema, batches):
            pass

    return target


def slice_seeds() -> tuple[list[bytes], list[tuple[pa.Schema, int]]]:
    from quarry.store import codec

    table = pa.table({"id": pa.array(range(100), pa.int64()), "s": [f"v{i}" for i in range(100)]})
    seeds, shapes = [], []
    for compression in ("none", "zstd", "lz4"):
        seeds.append(codec.encode_slice(table.to_batches()[0], compression))
        shapes.append((table.schema, table.num_rows))
    return seeds, shapes


def decode_any_slice(schema: pa.Schema, rows: int) -> Callable[[bytes], None]:
    from quarry.store import codec

    def target(data: bytes) -> None:
        codec.decode_slice(data, schema, rows)

    return target


def file_seeds(folder: Path) -> dict[str, list[bytes]]:
    """A small file of every format ingest reads."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(range(50), pa.int64()), "x": [i / 3 for i in range(50)]})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    parquet = sink.getvalue()
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    csv = sink.getvalue()
    arrow = pa.BufferOutputStream()
    with pa.ipc.new_file(arrow, table.schema) as writer:
        writer.write_table(table)
    seeds = {"parquet": [parquet], "csv": [csv], "arrow": [arrow.getvalue().to_pybytes()]}
    seeds["h5ad"] = [_h5ad_bytes(folder)]
    seeds["mtx"] = [_mtx_bytes()]
    return seeds


def _h5ad_bytes(folder: Path) -> bytes:
    import anndata
    import numpy as np
    from scipy import sparse

    path = folder / "seed.h5ad"
    values = sparse.random(20, 10, density=0.3, format="csr", dtype=np.float32, random_state=1)
    anndata.AnnData(X=values).write_h5ad(path)
    return path.read_bytes()


def _mtx_bytes() -> bytes:
    return b"%%MatrixMarket matrix coordinate real general\n3 2 3\n1 1 1.5\n2 2 2.0\n3 1 4\n"


def read_any_file(kind: str, folder: Path) -> Callable[[bytes], None]:
    """What ingest does with a file of ``kind``: open it and read every row."""
    from quarry.coordinator.ingest.sources import GuardedReader, open_source

    suffix = {"parquet": ".parquet", "csv": ".csv", "arrow": ".arrow", "h5ad": ".h5ad"}

    def target(data: bytes) -> None:
        if kind == "mtx":
            _read_mtx(data, folder)
            return
        path = folder / f"input{suffix[kind]}"
        path.write_bytes(data)
        if kind == "h5ad":
            from quarry.genes import readers

            readers.HDF5_CHECK_S = HDF5_CHECK_S
            readers.read_h5ad(path)
            return
        opened = open_source(path)
        for _ in GuardedReader(opened):
            pass

    return target


def _read_mtx(data: bytes, folder: Path) -> None:
    from quarry.genes.readers import read_mtx

    directory = folder / "mtx"
    directory.mkdir(exist_ok=True)
    (directory / "matrix.mtx").write_bytes(data)
    (directory / "features.tsv").write_text("g1\tg1\ng2\tg2\ng3\tg3\n")
    (directory / "barcodes.tsv").write_text("c1\nc2\n")
    read_mtx(directory)


def target_names() -> tuple[str, ...]:
    return ("frames", "substrait", "slices", "parquet", "csv", "arrow", "h5ad", "mtx")


def targets(folder: Path) -> dict[str, tuple[Callable[[bytes], Any], list[bytes]]]:
    """Every in-process target: name -> (decoder, seeds)."""
    found: dict[str, tuple[Callable[[bytes], Any], list[bytes]]] = {}
    from quarry.protocol.examples import EXAMPLES

    frames = [m.encode() for m in EXAMPLES if m.KIND]
    found["frames"] = (decode_any_frame, frames)
    stages, schema, batches = substrait_seeds()
    found["substrait"] = (run_any_stage(schema, batches), stages)
    slices, shapes = slice_seeds()
    found["slices"] = (decode_any_slice(*shapes[0]), slices)
    for kind, seeds in file_seeds(folder).items():
        found[kind] = (read_any_file(kind, folder), seeds)
    return found
