# k-means (Lloyd) on 3-D points, 8 centres. Plain Python, run unchanged by `quarry run`.
import sys

import numpy as np
import pandas as pd

k = int(sys.argv[2]) if len(sys.argv) > 2 else 8
max_iterations = int(sys.argv[3]) if len(sys.argv) > 3 else 50
points = pd.read_parquet(sys.argv[1] + "/points.parquet", columns=["x", "y", "z"])
X = points[["x", "y", "z"]].to_numpy()
C = X[:k].copy()
iterations = 0
for _ in range(max_iterations):
    # assign every point to its nearest centre
    best = np.full(len(X), np.inf)
    labels = np.zeros(len(X), dtype=np.int64)
    for j in range(len(C)):
        d = ((X - C[j]) ** 2).sum(axis=1)
        closer = d < best
        best = np.where(closer, d, best)
        labels = np.where(closer, j, labels)
    # per-cluster partial sums and counts give the new centres (an empty cluster keeps its own)
    counts = np.bincount(labels, minlength=len(C))
    sums = np.stack(
        [np.bincount(labels, weights=X[:, i], minlength=len(C)) for i in range(3)], axis=1
    )
    moved = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], C)
    shift = np.abs(moved - C).max()
    C = moved
    iterations += 1
    if shift < 1e-6:
        break
print(np.round(C, 4))
print(f"iterations {iterations}")
