"""ActivePy Eq. 1, written once: the two sides of a pushdown decision.

    push down when   DS_raw / BW + CT_host   >   CT_device + DS_processed / BW       (Eq. 1)

Every cut of a sub-plan costs what the device computes, what crosses the link and what the host
computes after (``cut_s``); Eq. 1 compares its two ends: the host path (ship raw, the host does
the work) and the device path (the device does the work, ships what is left). CSDPLAN's Eq. 1
and 3 are the same two sides (SSD system: transfer + host compute; CSD system: the drive's own
transfer + its compute).

The four users (DESIGN §4) call these: the coordinator's choice of cut (``cost.model``), the
device's run-time decision (``device.controller.Adaptive``), the capacity planner
(``capacity.model``) and, through ``HostCost``, the genes dispatch. The device controller prices
per stored byte, hence the ``_per_byte`` forms: the sums are linear, so they are the same sums
over bytes shipped per stored byte and seconds per stored byte.
"""

from __future__ import annotations

# a device told it may count on none of the host still prices the host path: finite, prohibitive
HOST_SHARE_MIN = 1e-6


def transfer_s(size_bytes: float, link_bytes_per_s: float) -> float:
    """DS / BW: seconds to move ``size_bytes`` over a link."""
    assert link_bytes_per_s > 0, f"link bandwidth must be positive, got {link_bytes_per_s}"
    return size_bytes / link_bytes_per_s


def cut_s(device_compute_s: float, shipped_s: float, host_compute_s: float) -> float:
    """Seconds of one cut: the device computes, the result crosses the link, the host finishes."""
    return device_compute_s + shipped_s + host_compute_s


def host_path_s(raw_transfer_s: float, host_compute_s: float) -> float:
    """Eq. 1's left side, DS_raw / BW + CT_host: ship raw, the host does all the work."""
    return cut_s(0.0, raw_transfer_s, host_compute_s)


def device_path_s(device_compute_s: float, processed_transfer_s: float) -> float:
    """Eq. 1's right side, CT_device + DS_processed / BW: the device works, ships the rest."""
    return cut_s(device_compute_s, processed_transfer_s, 0.0)


def pushes_down(host_s: float, device_s: float) -> bool:
    """Eq. 1 itself: pushing down pays when the host path is the slower."""
    return host_s > device_s


def cut_s_per_byte(
    device_compute_s_per_byte: float,
    shipped_bytes_per_byte: float,
    link_bytes_per_s: float,
    host_compute_s_per_byte: float,
) -> float:
    """``cut_s`` per stored byte (the device controller's price of a partial cut)."""
    return cut_s(
        device_compute_s_per_byte,
        transfer_s(shipped_bytes_per_byte, link_bytes_per_s),
        host_compute_s_per_byte,
    )


def host_path_s_per_byte(
    raw_bytes_per_byte: float, link_bytes_per_s: float, host_compute_s_per_byte: float
) -> float:
    """``host_path_s`` per stored byte."""
    return host_path_s(transfer_s(raw_bytes_per_byte, link_bytes_per_s), host_compute_s_per_byte)


def device_path_s_per_byte(
    device_compute_s_per_byte: float, processed_bytes_per_byte: float, link_bytes_per_s: float
) -> float:
    """``device_path_s`` per stored byte."""
    return device_path_s(
        device_compute_s_per_byte, transfer_s(processed_bytes_per_byte, link_bytes_per_s)
    )


def on_host_share(host_compute: float, host_share: float) -> float:
    """Host compute (seconds, or seconds per byte) when this work may count on only
    ``host_share`` of the host: the host completes every device's pushed-back work at once."""
    return host_compute / max(host_share, HOST_SHARE_MIN)
