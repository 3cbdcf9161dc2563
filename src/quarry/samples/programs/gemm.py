# Mixed GEMM: B = A W, then B^T B and A^T A. Plain Python, run unchanged by `quarry run`.
import sys

import numpy as np
import pandas as pd

m = pd.read_parquet(sys.argv[1] + "/matrix.parquet")
A = m.to_numpy()
W = np.sin(np.arange(1.0, A.shape[1] * 8 + 1.0)).reshape(A.shape[1], 8)
B = A @ W
G = B.T @ B
ata = A.T @ A
rows = len(A)
print(f"rows {rows}")
print("B^T B / rows")
print(np.round(G / rows, 4))
print(f"trace(A^T A) / rows {np.trace(ata) / rows:.4f}")
print("diag(A^T A)[:8] / rows")
print(np.round(np.diag(ata)[:8] / rows, 4))
