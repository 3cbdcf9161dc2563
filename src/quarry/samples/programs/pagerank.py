# PageRank, 20 power iterations over an edge list. Plain Python, run unchanged by `quarry run`.
import sys

import numpy as np
import pandas as pd

iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 20
damping = 0.85
edges = pd.read_parquet(sys.argv[1] + "/edges.parquet", columns=["src", "dst"])
src = edges.src.to_numpy().astype(np.int32)
dst = edges.dst.to_numpy().astype(np.int32)
top = edges.max()
n = int(top.max()) + 1
deg = np.bincount(src, minlength=n)
# CSR by source: the targets of vertex v are targets[offsets[v]:offsets[v + 1]]
order = np.argsort(src, kind="stable")
targets = dst[order]
offsets = np.concatenate([[0], np.cumsum(deg)])
dangling = deg == 0
rank = np.full(n, 1.0 / n)
for _ in range(iterations):
    share = np.where(dangling, 0.0, rank / np.maximum(deg, 1))
    incoming = np.bincount(targets, weights=np.repeat(share, np.diff(offsets)), minlength=n)
    rank = (1.0 - damping) / n + damping * (incoming + rank[dangling].sum() / n)
best = np.argsort(-rank, kind="stable")[:10]
result = pd.DataFrame({"vertex": best, "rank": np.round(rank[best], 6)})
print(f"vertices {n} edges {len(targets)}")
print(result.to_string(index=False))
