# TPC-H Q1 (pricing summary report). Plain Python, run unchanged by `quarry run`.
import sys

import pandas as pd

delta = int(sys.argv[2]) if len(sys.argv) > 2 else 90
cutoff = (pd.Timestamp("1998-12-01") - pd.Timedelta(days=delta)).date()
li = pd.read_parquet(
    sys.argv[1] + "/lineitem.parquet",
    columns=[
        "l_returnflag",
        "l_linestatus",
        "l_quantity",
        "l_extendedprice",
        "l_discount",
        "l_tax",
        "l_shipdate",
    ],
)
li = li[li.l_shipdate <= cutoff]
li = li.assign(disc_price=li.l_extendedprice * (1 - li.l_discount))
li = li.assign(charge=li.disc_price * (1 + li.l_tax))
stats = li.groupby(["l_returnflag", "l_linestatus"]).agg(
    sum_qty=("l_quantity", "sum"),
    sum_base_price=("l_extendedprice", "sum"),
    sum_disc_price=("disc_price", "sum"),
    sum_charge=("charge", "sum"),
    avg_qty=("l_quantity", "mean"),
    avg_price=("l_extendedprice", "mean"),
    avg_disc=("l_discount", "mean"),
    count_order=("l_quantity", "count"),
)
print(stats.round(2).to_string(float_format="{:.2f}".format))
