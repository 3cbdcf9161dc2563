# Black-Scholes price of every option, then summaries. Plain Python, run unchanged by `quarry run`.
import sys

import numpy as np
import pandas as pd


def cdf(x):
    # standard normal CDF from the erf of Abramowitz-Stegun 7.1.26 (error below 1.5e-7)
    z = np.abs(x) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


opts = pd.read_parquet(sys.argv[1] + "/options.parquet")
opts["vol_t"] = opts["v"] * np.sqrt(opts["T"])
opts["d1"] = (
    np.log(opts["S"] / opts["K"]) + (opts["r"] + 0.5 * opts["v"] ** 2) * opts["T"]
) / opts["vol_t"]
opts["d2"] = opts["d1"] - opts["vol_t"]
opts["pv_strike"] = opts["K"] * np.exp(-opts["r"] * opts["T"])
opts["call_price"] = opts["S"] * cdf(opts["d1"]) - opts["pv_strike"] * cdf(opts["d2"])
opts["put_price"] = opts["pv_strike"] * cdf(-opts["d2"]) - opts["S"] * cdf(-opts["d1"])
opts["price"] = np.where(opts["call"], opts["call_price"], opts["put_price"])
opts["in_money"] = np.where(opts["call"], opts["S"] > opts["K"], opts["S"] < opts["K"])
count = len(opts)
mean_price = opts["price"].mean()
total = opts["price"].sum()
in_money = opts["in_money"].sum()
top = opts["price"].max()
print(f"options {count}")
print(f"mean_price {mean_price:.4f}")
print(f"total_value {total:.2f}")
print(f"in_the_money {in_money}")
print(f"max_price {top:.4f}")
