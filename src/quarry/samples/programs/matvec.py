# Matrix-vector product y = A v. Plain Python, run unchanged by `quarry run`.
import sys

import numpy as np
import pandas as pd

m = pd.read_parquet(sys.argv[1] + "/matrix.parquet")
A = m.to_numpy()
v = np.linspace(-1.0, 1.0, A.shape[1])
y = A @ v
total = y.sum()
squares = (y * y).sum()
largest = y.max()
head = y[:5]
print(f"rows {len(y)}")
print(f"sum {total:.4f}")
print(f"norm {np.sqrt(squares):.4f}")
print(f"max {largest:.6f}")
print(np.round(head, 6))
