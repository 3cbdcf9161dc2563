"""quarry's Matrix Market reader: scipy's answers on valid files, a clear error on malformed
ones (where scipy's own reader can take the process down)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import scipy.io
from scipy import sparse

from quarry.genes import matrix_market
from quarry.genes.errors import GenesInputError


def _write(tmp_path, text: str, name: str = "m.mtx"):
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text",
    [
        "%%MatrixMarket matrix coordinate real general\n% note\n3 2 3\n1 1 1.5\n2 2 2\n3 1 4\n",
        "%%MatrixMarket matrix coordinate integer general\n2 2 1\n2 1 7\n",
        "%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 1\n",
        "%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n1 1 1\n3 1 2\n3 2 5\n",
        "%%MatrixMarket matrix array real general\n2 3\n1\n2\n3\n4\n5\n6\n",
        "%%MatrixMarket matrix coordinate real general\n4 5 0\n",
    ],
)
def test_same_matrix_as_scipy(tmp_path, text):
    path = _write(tmp_path, text)
    ours = matrix_market.read(path)
    theirs = scipy.io.mmread(str(path))
    dense = ours.toarray() if sparse.issparse(ours) else ours
    expected = theirs.toarray() if sparse.issparse(theirs) else theirs
    np.testing.assert_array_equal(dense, expected)
    gz = matrix_market.read(_write(tmp_path, text, "m.mtx.gz"))
    np.testing.assert_array_equal(gz.toarray() if sparse.issparse(gz) else gz, expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("%%Mat.0.3 1 D8\n", "banner"),
        ("%%MatrixMarket matrix coordinate real general\n3 2 1\n4 1 1.0\n", "i index out of"),
        ("%%MatrixMarket matrix coordinate real general\n3 2 1\n0 1 1.0\n", "i index out of"),
        ("%%MatrixMarket matrix coordinate real general\n3 2 1\n1 9 1.0\n", "j index out of"),
        ("%%MatrixMarket matrix coordinate real general\n3 2 2\n1 1 1.0\n", "promises 2 entries"),
        ("%%MatrixMarket matrix coordinate real general\n3 x 2\n", "size line"),
        ("%%MatrixMarket matrix coordinate real general\n", "ends before its size line"),
        ("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n", "field"),
        ("%%MatrixMarket matrix coordinate real general\n99999999999 1 0\n", "beyond"),
        ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n", "needs 4 values"),
        ("%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 abc\n", "not a valid"),
    ],
)
def test_malformed_files_are_refused_clearly(tmp_path, text, message):
    with pytest.raises(GenesInputError, match=message):
        matrix_market.read(_write(tmp_path, text))
