"""Offload of plain Python programs (ActivePy, §III): the program as lines, its reads mapped to
stored datasets, a sampling phase that times every line at four scales, a fit of each line's
cost to a complexity class, and Algorithm 1 choosing the lines that run near the data.

Rooms: ``program`` (a script as top-level lines, the names each reads and binds), ``reads``
(the program's file reads served from quarry), ``profile`` (one line-level run: time, data
access apart, bytes in and out), ``fit`` (O(1) .. O(n³) and extrapolation), ``assign``
(Algorithm 1 on Eq. 1's terms), ``partitions`` (which lines give, per partition, what they give
on the whole), ``device`` and ``worker`` (the lines as a unit of work, in a limited process),
``cut`` (a program run with its cut), ``run`` (the entry point: ``quarry run``).
"""
