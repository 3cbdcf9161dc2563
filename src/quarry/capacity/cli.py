"""``quarry capacity``: break-even points, hardware sweeps and cost of CSD-based nodes (CSDPLAN).

Runnable on its own as ``python -m quarry.capacity.cli``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from quarry.capacity.break_even import BreakEven, break_even
from quarry.capacity.kernel_data import KernelInputError, make_inputs
from quarry.capacity.kernels import KERNELS, run_kernel
from quarry.capacity.model import CapacityInputError, CapacityInputs, HostConfig
from quarry.capacity.presets import PRESETS, load_inputs, preset
from quarry.capacity.report import dumps, write_json
from quarry.capacity.tco import SystemCost, compute_tco, load_spec

app = typer.Typer(
    help="Capacity planning for computational storage (CSDPLAN): how many CSDs beat a host.",
    no_args_is_help=True,
)
console = Console()
errors = Console(stderr=True)

WorkloadOption = Annotated[
    str | None,
    typer.Option(
        "--workload", "-w",
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
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _fail(error: Exception) -> typer.Exit:
    errors.print(f"[bold red]error:[/] {error}", highlight=False)
    return typer.Exit(code=2)


def _guarded(function: Callable[[], None]) -> None:
    try:
        function()
    except (CapacityInputError, KernelInputError) as error:
        raise _fail(error) from None


def _numbers(field: str, text: str, count: int) -> list[float]:
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != count:
        raise CapacityInputError(field, f"expected {count} comma-separated numbers, got {text!r}",
                                 f"give --{field} with {count} values")
    try:
        return [float(part) for part in parts]
    except ValueError:
        raise CapacityInputError(field, f"not a number in {text!r}", "give plain numbers") from None


def resolve_inputs(
    workload: str | None, times: str | None, ratios: str | None, inputs: Path | None
) -> CapacityInputs:
    """Exactly one source of inputs: --times, --ratios, --inputs, or a preset by --workload."""
    given = [name for name, value in (("times", times), ("ratios", ratios), ("inputs", inputs))
             if value is not None]
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
            "workload", "missing",
            f"give --workload (one of {', '.join(PRESETS)}) or --times, --ratios, --inputs",
        )
    return preset(workload)


def _emit(document: dict[str, Any], filename: str, as_json: bool, out: Path | None) -> None:
    if out is not None:
        path = write_json(document, Path(out) / filename)
        if not as_json:
            console.print(f"wrote {path}")
    if as_json:
        typer.echo(dumps(document))


def _bep_table(inputs: CapacityInputs, host: HostConfig, result: BreakEven) -> Table:
    unit = "" if inputs.normalized else " s"
    table = Table(title=f"Break-even point: {inputs.name}", show_lines=False)
    table.add_column("term")
    table.add_column("value", justify="right")
    table.add_column("meaning")
    rows = [
        ("T_SSD-tx", f"{inputs.t_ssd_tx_s:.4g}{unit}", "host reads the working set from one SSD"),
        ("T_SSD-comp", f"{inputs.t_ssd_comp_s:.4g}{unit}", "host computes on one core"),
        (f"T_SSD({host.host_cores})-comp", f"{result.t_ssd_comp_n_s:.4g}{unit}",
         f"Eq. 2: on n = {host.host_cores} cores"),
        ("T_CSD-tx", f"{inputs.t_csd_tx_s:.4g}{unit}", "CSD loads the working set internally"),
        ("T_CSD-comp", f"{inputs.t_csd_comp_s:.4g}{unit}", "CSD computes on it"),
        ("sd_tx, sd_comp", f"{host.sd_tx:g}, {host.sd_comp:g}", "host slow-down (Eq. 4)"),
        ("R_tx", f"{result.ratios.r_tx:.4g}", "T_SSD-tx / T_CSD-tx"),
        (f"R_({host.host_cores})comp", f"{result.ratios.r_comp:.4g}", "T_SSD(n)-comp / T_CSD-comp"),
        (f"R_({host.host_cores})SSD", f"{result.ratios.r_ssd:.4g}", "T_SSD-tx / T_SSD(n)-comp"),
        ("Eq. 8 numerator", f"{result.eq8_numerator_s:.4g}{unit}",
         "T_CSD-tx + T_CSD-comp - sd_tx T_SSD-tx"),
        ("Eq. 8 denominator", f"{result.eq8_denominator_s:.4g}{unit}", "sd_comp T_SSD(n)-comp"),
        ("Eq. 8 value", f"{result.eq8_value:.4g}", "= Eq. 12 / 13 in ratio form"),
        ("Eq. 8 BEP", str(result.bep_eq8), "max(ceil(value), 1), ignoring k_limit"),
        ("k_limit", str(host.k_limit),
         "binds: BEP solved with Eq. 5-7" if result.k_limit_binds else "does not bind"),
    ]
    if result.capped_value is not None:
        rows.append(("capped value", f"{result.capped_value:.4g}",
                     "(T_CSD-tx + T_CSD-comp) / T_SSD-array(k_limit)"))
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
            config = SweepConfig.single(resolve_inputs(workload, times, ratios, inputs), host,
                                        target_bep)
        else:
            config = SweepConfig.paper(host, target_bep)
            if workload is not None:
                config = replace(config, surface_inputs=preset(workload))
        config = replace(config, factors=tuple(range(1, factor_max + 1)))
        summary = run_sweep(config, out)
        if as_json:
            typer.echo(dumps(summary))
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
        typer.echo(dumps(document))
        return
    table = Table(title="Preset workloads (seconds for the paper's working sets)")
    table.add_column("name", no_wrap=True)
    for column in ("GB", "SSD-tx", "SSD-comp", "CSD-tx", "CSD-comp", "BEP Host(1)"):
        table.add_column(column, justify="right")
    for name, inputs in PRESETS.items():
        table.add_row(
            name, f"{(inputs.data_bytes or 0) / 1e9:g}", f"{inputs.t_ssd_tx_s:.4g}",
            f"{inputs.t_ssd_comp_s:.4g}", f"{inputs.t_csd_tx_s:.4g}", f"{inputs.t_csd_comp_s:.4g}",
            str(break_even(inputs, HostConfig()).bep),
        )
    console.print(table)


@app.command()
def measure(
    kernel: Annotated[str, typer.Option(help=f"One of {', '.join(KERNELS)}.")],
    data_bytes: Annotated[int, typer.Option("--bytes", help="Working-set size in bytes.")] = 10**8,
    threads: Annotated[int, typer.Option(help="Threads for the computation.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Run a §4 kernel on this host on generated data; prints transfer and compute times."""

    def run() -> None:
        report = run_kernel(kernel, make_inputs(kernel, data_bytes), threads)
        report.pop("result")
        if as_json:
            typer.echo(dumps(report))
            return
        console.print(
            f"{kernel}: {report['bytes']:,} bytes, {threads} thread(s): "
            f"transfer {report['transfer_s']:.4f} s, compute {report['compute_s']:.4f} s"
        )

    _guarded(run)


if __name__ == "__main__":
    app()
