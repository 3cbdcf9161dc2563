"""What each device is told of the costs of whoever completes its work (DESIGN §4).

The cut a level chooses (``cost.model.choose``) is only where its devices start: each adapts at
run time against ActivePy Eq. 1 with the numbers it is told here, its completer's cost to do
the work itself, the link between them and the share of the completer it may count on. The
host tells its devices (``coordinator.planning``); a storage server, a host to its drives, tells
its own (``server.costs``), on its own figures, so a drive weighs pushing back against the CPU
that would take it back, not the host's two levels up.
"""

from __future__ import annotations

from quarry.cost.model import (
    DeviceFigures,
    HostFigures,
    SubPlanFigures,
    device_full_s_per_byte,
    host_share,
)
from quarry.protocol.stage import Stage
from quarry.protocol.work import HostCost


def told(
    devices: list[DeviceFigures], f: SubPlanFigures, host: HostFigures, cut: Stage
) -> dict[str, HostCost]:
    """Each device's ``HostCost``: the completer's seconds per stored byte (``f`` is at this
    machine's speed; the completer's compute factor applied), the device's own estimated
    seconds, the link (the device's, or its even share of the completer's ingress when that is
    narrower) and its even share of the completer's cores."""
    share = host_share(host.cores, len(devices))
    ingress = host.link_bytes_per_s / len(devices) if host.link_bytes_per_s else None
    return {
        d.name: HostCost(
            full_s_per_byte=f.full_s_per_byte * host.compute_factor,
            filter_s_per_byte=f.filter_s_per_byte * host.compute_factor,
            device_full_s_per_byte=device_full_s_per_byte(d, f),
            raw_ratio=f.raw_ratio,
            filter_ratio=f.filter_ratio,
            link_bytes_per_s=min(d.link_bytes_per_s, ingress or d.link_bytes_per_s),
            host_share=share,
            start=Stage(cut),
            compute_factor=host.compute_factor,
            output_ratio=f.output_ratio,
            read_ratio=f.read_ratio,
        )
        for d in devices
    }


def figures_of(cost: HostCost) -> SubPlanFigures | None:
    """The sub-plan's figures at this machine's speed, as a completer was told them; None when
    they were not all told (a unit whose cut is not chosen by the model)."""
    if cost.output_ratio is None:
        return None
    return SubPlanFigures(
        full_s_per_byte=cost.full_s_per_byte / cost.compute_factor,
        filter_s_per_byte=cost.filter_s_per_byte / cost.compute_factor,
        raw_ratio=cost.raw_ratio,
        filter_ratio=cost.filter_ratio,
        output_ratio=cost.output_ratio,
        read_ratio=cost.read_ratio,
    )
