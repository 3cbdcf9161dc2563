# TPC-H Q6 (forecasting revenue change). Plain Python, run unchanged by `quarry run`.
import sys

import pandas as pd

start = pd.Timestamp(sys.argv[2] if len(sys.argv) > 2 else "1994-01-01")
lo = start.date()
hi = (start + pd.DateOffset(years=1)).date()
li = pd.read_parquet(
    sys.argv[1] + "/lineitem.parquet",
    columns=["l_shipdate", "l_discount", "l_quantity", "l_extendedprice"],
)
li = li[(li.l_shipdate >= lo) & (li.l_shipdate < hi)]
li = li[(li.l_discount >= 0.05) & (li.l_discount <= 0.07) & (li.l_quantity < 24)]
revenue = (li.l_extendedprice * li.l_discount).sum()
print(f"revenue {revenue:.2f}")
