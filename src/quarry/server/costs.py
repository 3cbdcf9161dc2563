"""A storage server is the host to its drives: under ``pushdown="auto"`` it chooses where they
start, and tells each its costs, with the one cost model on its own figures (Skytether §4:
each level decomposes for the one below).

The host chose a cut for the server as one device with the server's profile; what the server
does below it is its own choice. It rebuilds the sub-plan's figures from what the host told it
(``cost.told.figures_of``: this machine's seconds per byte and the ratios of data moved), prices
its drives as the host prices devices (their profiles, their load, the bytes they hold of this
request) against itself as the completer (its cores, compute factor and ingress from the
drives), picks the cut (``cost.model.choose``) and tells each drive its costs
(``cost.told.told``). A drive then pushes back against the CPU that takes the work back (this
server's), not the host's two levels up. Whether the server completes what comes back or
passes it on is the other half of the level's decision (``server.work.host_cheaper``).
"""

from __future__ import annotations

from dataclasses import replace

from quarry.cost.model import CUTS, DeviceFigures, HostFigures, SubPlanFigures, choose
from quarry.cost.told import figures_of, told
from quarry.protocol.stage import Stage
from quarry.protocol.work import HostCost


def drive_costs(
    host: HostCost,
    server: HostFigures,
    drives: list[DeviceFigures],
    allowed: tuple[Stage, ...] = CUTS,
) -> dict[str, HostCost]:
    """Each drive's costs, told by this server: the cut it chose for them, and its own seconds
    per byte, link and cores. For a unit whose cut the model does not choose (the host sent no
    output ratio) the host's start stands, re-based on this server's figures."""
    figures = figures_of(host)
    if figures is None:
        rebased = SubPlanFigures(
            full_s_per_byte=host.full_s_per_byte / host.compute_factor,
            filter_s_per_byte=host.filter_s_per_byte / host.compute_factor,
            raw_ratio=host.raw_ratio,
            filter_ratio=host.filter_ratio,
            output_ratio=0.0,
        )
        costs = told(drives, rebased, server, host.start)
        return {name: replace(cost, output_ratio=None) for name, cost in costs.items()}
    return told(drives, figures, server, choose(drives, figures, server, allowed).cut)
