"""``quarry capacity``: break-even points, hardware sweeps and cost of CSD-based nodes (CSDPLAN).

Runnable on its own as ``python -m quarry.capacity.cli``. The cluster option, the console, JSON
printing and error lines are ``quarry.cli_common``'s, as in every quarry command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from quarry.capacity.break_even import BreakEven, break_even
from quarry.capacity.kernel_data import KernelInputError, make_inputs, working_set_bytes
from quarry.capacity.kernels import KERNELS, check_kernel, run_kernel
from quarry.capacity.model import CapacityInputError, CapacityInputs, HostConfig
from quarry.capacity.presets import PRESETS, load_inputs, preset
from quarry.capacity.report import jsonable, write_json
from quarry.capacity.tco import SystemCost, compute_tco, load_spec
from quarry.cli_common import (
    ClusterOption,
    JsonOption,
    ReflowedHelp,
    cluster_file,
    console,
    open_cluster,
    print_json,
    run,
    user_errors,
)
from quarry.errors import ClusterError

app = typer.Typer(
    cls=ReflowedHelp,
    help="Capacity planning for computational storage (CSDPLAN): how many CSDs beat a host.",
    no_args_is_help=True,
)

WorkloadOption = Annotated[
    str | None,
    typer.Option(
        "--workload",
        "-w",
        help="A preset such as count-newport (see `workloads`), or an entry of --inputs.",
    ),
]
TimesOption = Annotated[
    str | None,
    typer.Option(help="T_SSD-tx,T_SSD-comp,T_CSD-tx,T_CSD-comp in seconds (host on one core)."),
]
RatiosOption = Annotated[
    str | None, typer.Option(help="R_tx,R_comp,R_SSD measured with one host core.")
]
InputsOption = Annotated[
    Path | None, typer.Option(help="JSON file of times or ratios (e.g. from quarry calibrate).")
]
HostCoresOption = Annotated[int, typer.Option(help="Active host cores n (Eq. 2).")]
KLimitOption = Annotated[int, typer.Option(help="SSDs that saturate the host bus (Eq. 6).")]

# The planner's inputs are checked by ValueErrors of its own, not QuarryErrors (it runs without a
# cluster); to the user they are mistakes to fix like any other, so they end the same way.
INPUT_ERRORS = (CapacityInputError, KernelInputError)


def _guarded(function: Callable[[], None]) -> None:
    with user_errors(*INPUT_ERRORS):
        function()


def _numbers(field: str, text: str, count: int) -> list[float]:
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != count:
        raise CapacityInputError(
            field,
            f"expected {count} comma-separated numbers, got {text!r}",
            f"give --{field} with {count} values",
        )
    try:
        return [float(part) for part in parts]
    except ValueError:
        raise CapacityInputError(field, f"not a number in {text!r}", "give plain numbers") from None


def resolve_inputs(
    workload: str | None, times: str | None, ratios: str | None, inputs: Path | None
) -> CapacityInputs:
    """Exactly one source of inputs: --times, --ratios, --inputs, or a preset by --workload."""
    given = [
        name
        for name, value in (("times", times), ("ratios", ratios), ("inputs", inputs))
        if value is not None
    ]
    if len(given) > 1:
        raise CapacityInputError(given[1], f"given together with --{given[0]}", "give only one")
    name = workload or "custom"
    if times is not None:
        return CapacityInputs(*_numbers("times", times, 4), name=name)
    if ratios is not None:
        return CapacityInputs.from_ratios(*_numbers("ratios", ratios, 3), name=name)
    if inputs is not None:
        return load_inputs(inputs, workload)
    if workload is None:
        raise CapacityInputError(
            "workload",
            "missing",
            f"give --workload (one of {', '.join(PRESETS)}) or --times, --ratios, --inputs",
        )
    return preset(workload)


def _emit(document: dict[str, Any], filename: str, as_json: bool, out: Path | None) -> None:
    if out is not None:
        path = write_json(document, Path(out) / filename)
        if not as_json:
            console.print(f"wrote {path}")
    if as_json:
        print_json(jsonable(document))


def _bep_table(inputs: CapacityInputs, host: HostConfig, result: BreakEven) -> Table:
    unit = "" if inputs.normalized else " s"
    table = Table(title=f"Break-even point: {inputs.name}", show_lines=False)
    table.add_column("term")
    table.add_column("value", justify="right")
    table.add_column("meaning")
    rows = [
        ("T_SSD-tx", f"{inputs.t_ssd_tx_s:.4g}{unit}", "host reads the working set from one SSD"),
        ("T_SSD-comp", f"{inputs.t_ssd_comp_s:.4g}{unit}", "host computes on one core"),
        (
            f"T_SSD({host.host_cores})-comp",
            f"{result.t_ssd_comp_n_s:.4g}{unit}",
            f"Eq. 2: on n = {host.host_cores} cores",
        ),
        ("T_CSD-tx", f"{inputs.t_csd_tx_s:.4g}{unit}", "CSD loads the working set internally"),
        ("T_CSD-comp", f"{inputs.t_csd_comp_s:.4g}{unit}", "CSD computes on it"),
        ("sd_tx, sd_comp", f"{host.sd_tx:g}, {host.sd_comp:g}", "host slow-down (Eq. 4)"),
        ("R_tx", f"{result.ratios.r_tx:.4g}", "T_SSD-tx / T_CSD-tx"),
        (f"R_({host.host_cores})comp", f"{result.ratios.r_comp:.4g}", "T_SSD(n)-comp / T_CSD-comp"),
        (f"R_({host.host_cores})SSD", f"{result.ratios.r_ssd:.4g}", "T_SSD-tx / T_SSD(n)-comp"),
        (
            "Eq. 8 numerator",
            f"{result.eq8_numerator_s:.4g}{unit}",
            "T_CSD-tx + T_CSD-comp - sd_tx T_SSD-tx",
        ),
        ("Eq. 8 denominator", f"{result.eq8_denominator_s:.4g}{unit}", "sd_comp T_SSD(n)-comp"),
        ("Eq. 8 value", f"{result.eq8_value:.4g}", "= Eq. 12 / 13 in ratio form"),
        ("Eq. 8 BEP", str(result.bep_eq8), "max(ceil(value), 1), ignoring k_limit"),
        (
            "k_limit",
            str(host.k_limit),
            "binds: BEP solved with Eq. 5-7" if result.k_limit_binds else "does not bind",
        ),
    ]
    if result.capped_value is not None:
        rows.append(
            (
                "capped value",
                f"{result.capped_value:.4g}",
                "(T_CSD-tx + T_CSD-comp) / T_SSD-array(k_limit)",
            )
        )
    rows.append(("T_SSD-array(BEP)", f"{result.t_ssd_array_at_bep_s:.4g}{unit}", "Eq. 5"))
    rows.append(("T_CSD-array(BEP)", f"{result.t_csd_array_at_bep_s:.4g}{unit}", "Eq. 7"))
    for row in rows:
        table.add_row(*row)
    return table


@app.command()
def bep(
    workload: WorkloadOption = None,
    times: TimesOption = None,
    ratios: RatiosOption = None,
    inputs: InputsOption = None,
    host_cores: HostCoresOption = 1,
    k_limit: KLimitOption = 8,
    sd_tx: Annotated[float, typer.Option(help="Host transfer slow-down (>= 1).")] = 1.0,
    sd_comp: Annotated[float, typer.Option(help="Host compute slow-down (>= 1).")] = 1.0,
    csd_io_factor: Annotated[float, typer.Option(help="CSD internal bandwidth x this.")] = 1.0,
    csd_compute_factor: Annotated[float, typer.Option(help="CSD compute power x this.")] = 1.0,
    as_json: JsonOption = False,
    out: Annotated[Path | None, typer.Option(help="Directory to write bep.json into.")] = None,
) -> None:
    """The least number of CSDs that beats a host with the same number of SSDs."""

    def run() -> None:
        base = resolve_inputs(workload, times, ratios, inputs)
        chosen = base.scaled(csd_io_factor, csd_compute_factor)
        host = HostConfig(host_cores=host_cores, k_limit=k_limit, sd_tx=sd_tx, sd_comp=sd_comp)
        result = break_even(chosen, host)
        document = {
            "command": "bep",
            "inputs": chosen.to_dict(),
            "csd_io_factor": csd_io_factor,
            "csd_compute_factor": csd_compute_factor,
            "host": host.to_dict(),
            "result": result.to_dict(),
        }
        if not as_json:
            console.print(_bep_table(chosen, host, result))
            console.print(
                f"[bold]BEP = {result.bep}[/] drives: {result.bep} CSDs are at least as fast as "
                f"Host({host.host_cores}) with {result.bep} SSDs (k_limit {host.k_limit})."
            )
        _emit(document, "bep.json", as_json, out)

    _guarded(run)


@app.command()
def sweep(
    workload: WorkloadOption = None,
    times: TimesOption = None,
    ratios: RatiosOption = None,
    inputs: InputsOption = None,
    host_cores: HostCoresOption = 1,
    k_limit: KLimitOption = 8,
    target_bep: Annotated[int, typer.Option("--bep", help="List hardware giving this BEP.")] = 4,
    factor_max: Annotated[int, typer.Option(help="Surfaces run factors 1..this.")] = 10,
    out: Annotated[Path, typer.Option(help="Directory for the PNGs and sweep.json.")] = Path(
        "capacity-sweep"
    ),
    as_json: JsonOption = False,
) -> None:
    """Figures 7, 8, 10 and 14 as PNG plus sweep.json; the paper's workloads unless given inputs."""
    from quarry.capacity.sweep import FACTORS_MAX, SweepConfig, run_sweep

    def run() -> None:
        if not 1 <= factor_max <= FACTORS_MAX:
            raise CapacityInputError("factor_max", f"got {factor_max}", f"give 1..{FACTORS_MAX}")
        host = HostConfig(host_cores=host_cores, k_limit=k_limit)
        custom = any(value is not None for value in (times, ratios, inputs))
        if custom or (workload is not None and workload not in PRESETS):
            config = SweepConfig.single(
                resolve_inputs(workload, times, ratios, inputs), host, target_bep
            )
        else:
            config = SweepConfig.paper(host, target_bep)
            if workload is not None:
                config = replace(config, surface_inputs=preset(workload))
        config = replace(config, factors=tuple(range(1, factor_max + 1)))
        summary = run_sweep(config, out)
        if as_json:
            print_json(jsonable(summary))
            return
        for name in ("figure10", "figure14"):
            figure = summary[name]
            corners = ", ".join(
                f"({c['x']:g}, {c['y']:g})" for c in figure["combinations"]["corners"]
            )
            console.print(
                f"{name}: {figure['x_label']} x {figure['y_label']}: least changes reaching "
                f"BEP <= {target_bep}: {corners or 'none in the grid'}"
            )
        for name, filename in summary["files"].items():
            console.print(f"wrote {Path(out) / filename} ({name})")
        console.print(f"wrote {Path(out) / summary['json']}")

    _guarded(run)


@app.command()
def tco(
    spec: Annotated[Path, typer.Option(help="TOML or JSON spec of CPUs, drives and systems.")],
    as_json: JsonOption = False,
    out: Annotated[Path | None, typer.Option(help="Directory to write tco.json into.")] = None,
) -> None:
    """Performance per dollar and capacity per dollar of each system (CSDPLAN Table 4)."""

    def run() -> None:
        costs = compute_tco(load_spec(spec))
        document = {"command": "tco", "spec": str(spec), "systems": [c.to_dict() for c in costs]}
        if not as_json:
            # One column per system: specs compare a few systems on many figures.
            table = Table(title=f"Total cost of ownership: {spec.name}")
            table.add_column("")
            for cost in costs:
                table.add_column(cost.name, justify="right")
            rows: list[tuple[str, Callable[[SystemCost], str]]] = [
                ("CPU", lambda c: c.cpu),
                ("PassMark", lambda c: f"{c.cpu_score:g}"),
                ("CPU slow-down", lambda c: f"{c.cpu_slowdown:.2f}x"),
                ("CPU $", lambda c: f"{c.cpu_cost_usd:,.0f}"),
                ("drives", lambda c: f"{c.drive_count} x {c.drive}"),
                ("storage $", lambda c: f"{c.storage_cost_usd:,.0f}"),
                ("total $", lambda c: f"{c.total_cost_usd:,.0f}"),
                ("performance", lambda c: f"{c.performance:g}"),
                ("performance / $", lambda c: f"{c.performance_per_usd:.1f}"),
                ("capacity GB / $", lambda c: f"{c.capacity_gb_per_usd:.2f}"),
                ("perf/$ vs baseline", lambda c: f"{c.performance_per_usd_vs_baseline:.2f}x"),
                ("GB/$ vs baseline", lambda c: f"{c.capacity_gb_per_usd_vs_baseline:.2f}x"),
            ]
            for label, cell in rows:
                table.add_row(label, *(cell(cost) for cost in costs))
            console.print(table)
        _emit(document, "tco.json", as_json, out)

    _guarded(run)


@app.command()
def workloads(as_json: JsonOption = False) -> None:
    """The preset workloads (the paper's, reconstructed; see docs/capacity.md)."""
    document = {name: inputs.to_dict() for name, inputs in PRESETS.items()}
    if as_json:
        print_json(jsonable(document))
        return
    table = Table(title="Preset workloads (seconds for the paper's working sets)")
    table.add_column("name", no_wrap=True)
    for column in ("GB", "SSD-tx", "SSD-comp", "CSD-tx", "CSD-comp", "BEP Host(1)"):
        table.add_column(column, justify="right")
    for name, inputs in PRESETS.items():
        table.add_row(
            name,
            f"{(inputs.data_bytes or 0) / 1e9:g}",
            f"{inputs.t_ssd_tx_s:.4g}",
            f"{inputs.t_ssd_comp_s:.4g}",
            f"{inputs.t_csd_tx_s:.4g}",
            f"{inputs.t_csd_comp_s:.4g}",
            str(break_even(inputs, HostConfig()).bep),
        )
    console.print(table)


@app.command()
def measure(
    kernel: Annotated[str, typer.Option(help=f"One of {', '.join(KERNELS)}.")],
    data_bytes: Annotated[int, typer.Option("--bytes", help="Working-set size in bytes.")] = 10**8,
    threads: Annotated[
        int | None,
        typer.Option(
            help="Threads computing: the device's (default: its cores), or with "
            "--host-only this host's (default 1)."
        ),
    ] = None,
    cluster: ClusterOption = None,
    device: Annotated[
        str | None, typer.Option(help="The device to measure (default: the first that answers).")
    ] = None,
    repeat: Annotated[int, typer.Option(help="Runs of each system; medians are kept.")] = 3,
    from_calibration: Annotated[
        bool,
        typer.Option(
            "--from-calibration",
            help="Use the device's stored `quarry calibrate` numbers instead of running "
            "the kernel on it (the host's computation is still timed, here).",
        ),
    ] = False,
    host_only: Annotated[
        bool, typer.Option("--host-only", help="Time the kernel on this host's CPU alone.")
    ] = False,
    host_cores: HostCoresOption = 1,
    k_limit: KLimitOption = 8,
    seed: Annotated[int, typer.Option(help="Seed of the generated working set.")] = 0,
    as_json: JsonOption = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Directory to add the inputs to, as measured.json (read by `bep --inputs`)."
        ),
    ] = None,
) -> None:
    """CSDPLAN Step 1: the four times of a §4 kernel on a live cluster (one device vs the host).

    The working set is generated, stored on one device as capacity/<kernel>_<bytes>_<device>
    (kept for the next run), and run both ways: read raw by the host and computed on one host
    core (T_SSD-tx, T_SSD-comp), and computed on the device by its built-in program
    capacity.<kernel> (T_CSD-tx, T_CSD-comp). Prints the times and the BEP they give.
    """

    def run() -> None:
        if host_only:
            _measure_host_only(kernel, data_bytes, threads or 1, as_json)
            return
        path = cluster_file(cluster)
        try:
            live = open_cluster(path)
        except ClusterError as error:
            raise ClusterError(
                f"{error}; or give --host-only to time the kernel on this machine alone"
            ) from None
        with live:
            document = _measure_cluster(
                live, kernel, data_bytes, threads, device, repeat, from_calibration, seed
            )
        document["cluster"] = str(path)
        inputs = CapacityInputs.from_mapping(document["inputs"])
        host = HostConfig(host_cores=host_cores, k_limit=k_limit)
        result = break_even(inputs, host)
        document.update({"host": host.to_dict(), "result": result.to_dict()})
        if out is not None:
            written = add_measured_inputs(Path(out) / "measured.json", inputs)
            if not as_json:
                console.print(
                    f"wrote {written} (use: quarry capacity bep --inputs {written} "
                    f"-w {inputs.name})"
                )
        if as_json:
            print_json(jsonable(document))
            return
        console.print(_bep_table(inputs, host, result))
        source = (
            "calibration of " if from_calibration else ""
        ) + f"{document['device']} ({document['profile']})"
        console.print(
            f"[bold]BEP = {result.bep}[/] drives for {kernel} on {data_bytes:,} bytes, measured "
            f"on {source}; one drive: host {inputs.t_ssd_tx_s + inputs.t_ssd_comp_s:.3f} s, "
            f"drive {inputs.t_csd_tx_s + inputs.t_csd_comp_s:.3f} s."
        )

    _guarded(run)


def _measure_host_only(kernel: str, data_bytes: int, threads: int, as_json: bool) -> None:
    report = run_kernel(kernel, make_inputs(kernel, data_bytes), threads)
    report.pop("result")
    if as_json:
        print_json(jsonable(report))
        return
    console.print(
        f"{kernel}: {report['bytes']:,} bytes, {threads} thread(s): "
        f"transfer {report['transfer_s']:.4f} s, compute {report['compute_s']:.4f} s"
    )


def _measure_cluster(
    live: Any,
    kernel: str,
    data_bytes: int,
    threads: int | None,
    device: str | None,
    repeat: int,
    from_calibration: bool,
    seed: int,
) -> dict[str, Any]:
    from quarry.capacity import measure as measuring

    if not from_calibration:
        with console.status(f"measuring {kernel} on the host and on a device ({repeat} runs each)"):
            measurement = measuring.measure_kernel(
                live,
                kernel,
                data_bytes,
                device=device,
                device_threads=threads,
                repeat=repeat,
                seed=seed,
            )
        return {
            "command": "measure",
            "kernel": kernel,
            "source": "kernel runs",
            "device": measurement.device,
            "profile": measurement.profile,
            "device_threads": measurement.device_threads,
            "inputs": measurement.inputs.to_dict(),
            "runs": measurement.to_dict(),
        }
    from quarry.coordinator.admin.calibrate import stored

    single = measuring.single_device(live, device)
    try:
        name = single.live_devices()[0].name
        report = stored(single.device(name))
        device_threads = threads or measuring.device_cores(single, name)
    finally:
        single.close()
    if report is None:
        raise CapacityInputError(
            "calibration",
            f"device {name} has no stored calibration",
            "run `quarry calibrate` first (it stores one on each device)",
        )
    check_kernel(kernel, device_threads)
    host_s = measuring.host_compute_s(kernel, data_bytes, 1, repeat=repeat, seed=seed)
    threaded_s = (
        host_s
        if device_threads == 1
        else measuring.host_compute_s(kernel, data_bytes, device_threads, repeat=repeat, seed=seed)
    )
    inputs = measuring.calibration_inputs(
        report,
        data_bytes=working_set_bytes(kernel, data_bytes),
        host_compute_s=host_s,
        device_compute_s=threaded_s,
        name=f"{kernel}-{report.profile}-calibrated",
    )
    return {
        "command": "measure",
        "kernel": kernel,
        "source": "calibration",
        "device": name,
        "profile": report.profile,
        "device_threads": device_threads,
        "calibration": report.to_json(),
        "inputs": inputs.to_dict(),
    }


def add_measured_inputs(path: Path, inputs: CapacityInputs) -> Path:
    """Add (or replace) ``inputs`` under its name in a ``{"workloads": ...}`` inputs file."""
    document: dict[str, Any] = {"workloads": {}}
    if path.is_file():
        try:
            document = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise CapacityInputError(
                "out", f"{path} is not valid JSON ({error})", "remove it or give another --out"
            ) from None
        if not isinstance(document.get("workloads"), dict):
            raise CapacityInputError("out", f"{path} is not an inputs file", "give another --out")
    document["workloads"][inputs.name] = inputs.to_dict()
    return write_json(document, path)


if __name__ == "__main__":
    run(app)
