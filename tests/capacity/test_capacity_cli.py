"""`quarry capacity` commands through typer's CliRunner."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quarry.capacity.cli import app

TABLE4 = Path(__file__).resolve().parents[2] / "docs" / "examples" / "csdplan-table4.toml"
runner = CliRunner()


def invoke(*arguments: str):
    return runner.invoke(app, list(arguments))


def test_bep_prints_the_terms_and_the_answer() -> None:
    result = invoke("bep", "--workload", "count-newport")
    assert result.exit_code == 0, result.output
    assert "BEP = 12" in result.output
    for term in ("T_SSD-tx", "R_tx", "Eq. 8 value", "k_limit"):
        assert term in result.output


def test_bep_json_with_host_options_and_out_dir(tmp_path: Path) -> None:
    result = invoke(
        "bep",
        "-w",
        "array_merge-newport",
        "--sd-comp",
        "2",
        "--host-cores",
        "1",
        "--k-limit",
        "8",
        "--json",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["result"]["bep"] == 6
    assert document["host"]["sd_comp"] == 2.0
    assert json.loads((tmp_path / "bep.json").read_text()) == document


def test_bep_from_times_ratios_and_a_file(tmp_path: Path) -> None:
    by_times = json.loads(invoke("bep", "--times", "1.5,0.75,1.0,1.925", "--json").output)
    assert by_times["result"]["bep"] == 2
    by_ratios = json.loads(invoke("bep", "--ratios", "1.5,0.5,2", "--json").output)
    assert by_ratios["result"]["ratios"]["r_comp"] == pytest.approx(0.5)
    path = tmp_path / "calibrated.json"
    path.write_text(
        json.dumps(
            {
                "workloads": {
                    "scan": {
                        "t_ssd_tx_s": 1.5,
                        "t_ssd_comp_s": 0.75,
                        "t_csd_tx_s": 8.0,
                        "t_csd_comp_s": 3.0,
                    }
                }
            }
        )
    )
    by_file = json.loads(invoke("bep", "--inputs", str(path), "-w", "scan", "--json").output)
    assert by_file["result"]["bep"] == 12 and by_file["inputs"]["name"] == "scan"


def test_bep_what_if_faster_csd() -> None:
    result = invoke("bep", "-w", "vector_addition-smartssd", "--csd-compute-factor", "5", "--json")
    assert json.loads(result.output)["result"]["bep"] == 1


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        (("bep", "--times", "1,1,-2,1"), "t_csd_tx_s"),
        (("bep", "--times", "1,1,1"), "times"),
        (("bep", "--ratios", "1,0,1"), "r_comp"),
        (("bep", "-w", "count-newport", "--k-limit", "0"), "k_limit"),
        (("bep", "-w", "count-newport", "--sd-tx", "0.5"), "sd_tx"),
        (("bep",), "workload"),
        (("bep", "-w", "nope"), "workload"),
        (("bep", "--times", "1,1,1,1", "--ratios", "1,1,1"), "ratios"),
    ],
)
def test_bad_input_exits_2_naming_the_field(arguments: tuple, field: str) -> None:
    result = invoke(*arguments)
    assert result.exit_code == 2
    assert f"{field}:" in result.output


@pytest.mark.slow
def test_sweep_writes_pngs_and_json(tmp_path: Path) -> None:
    result = invoke("sweep", "--out", str(tmp_path), "--factor-max", "8")
    assert result.exit_code == 0, result.output
    assert "(2, 7), (3, 4), (4, 3), (8, 2)" in result.output
    assert len(list(tmp_path.glob("*.png"))) == 4
    document = json.loads((tmp_path / "sweep.json").read_text())
    assert document["figure10"]["xs"] == [float(x) for x in range(1, 9)]


def test_sweep_on_custom_inputs_as_json(tmp_path: Path) -> None:
    result = invoke("sweep", "--times", "1,1,2,2", "--bep", "2", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["figure10"]["combinations"]["target"] == 2


def test_tco_reproduces_table4(tmp_path: Path) -> None:
    result = invoke("tco", "--spec", str(TABLE4), "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for value in ("13.2", "19.4", "29.3", "12.00"):
        assert value in result.output
    document = json.loads((tmp_path / "tco.json").read_text())
    assert [s["total_cost_usd"] for s in document["systems"]] == [3028, 2059, 1365]


def test_tco_without_prices_names_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(TABLE4.read_text().replace("price_usd = 1828\n", ""))
    result = invoke("tco", "--spec", str(spec))
    assert result.exit_code == 2
    assert "cpus.AMD EPYC 7351.price_usd: missing" in result.output


def test_workloads_and_measure() -> None:
    listed = json.loads(invoke("workloads", "--json").output)
    assert "count-smartssd" in listed
    result = invoke(
        "measure",
        "--kernel",
        "count",
        "--bytes",
        "400000",
        "--threads",
        "2",
        "--host-only",
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["threads"] == 2 and report["bytes"] == 400_000
    assert invoke("measure", "--kernel", "sort", "--host-only").exit_code == 2
