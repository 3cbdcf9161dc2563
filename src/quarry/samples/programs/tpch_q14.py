# TPC-H Q14 (promotion effect). Plain Python, run unchanged by `quarry run`.
import sys

import pandas as pd

start = pd.Timestamp(sys.argv[2] if len(sys.argv) > 2 else "1995-09-01")
lo = start.date()
hi = (start + pd.DateOffset(months=1)).date()
li = pd.read_parquet(
    sys.argv[1] + "/lineitem.parquet",
    columns=["l_partkey", "l_shipdate", "l_extendedprice", "l_discount"],
)
li = li[(li.l_shipdate >= lo) & (li.l_shipdate < hi)]
li = li.assign(revenue=li.l_extendedprice * (1 - li.l_discount))
part = pd.read_parquet(sys.argv[1] + "/part.parquet", columns=["p_partkey", "p_type"])
joined = li.merge(part, left_on="l_partkey", right_on="p_partkey")
joined = joined.assign(promo=joined.revenue.where(joined.p_type.str.startswith("PROMO"), 0.0))
promo = joined.promo.sum()
total = joined.revenue.sum()
share = 100.0 * promo / total if total > 0 else 0.0
print(f"promo_revenue {share:.2f}")
