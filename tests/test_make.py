"""The README's test command on a machine without R: `make test` passes and says, in one line,
how to run the R tests. Simulated with a PATH that has everything this one has but `Rscript`,
`R`, `apt-get` and `sudo` (what a laptop without root, or a Mac, looks like to the Makefile)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = frozenset({"Rscript", "R", "apt-get", "sudo"})
MAKE_TIMEOUT_S = 300


def _path_without(hidden: frozenset[str], folder: Path) -> str:
    """A folder of links to every program on the PATH but ``hidden``."""
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = folder / entry.name
            if entry.name in hidden or target.exists() or not os.access(entry.path, os.X_OK):
                continue
            target.symlink_to(entry.path)
    return str(folder)


def test_make_test_without_r_skips_the_r_test_in_one_line(tmp_path):
    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=ROOT).returncode != 0:
        pytest.skip("the environment is not built (or is older than pyproject.toml): make env")
    env = {**os.environ, "PATH": _path_without(HIDDEN, tmp_path / "bin")}
    done = subprocess.run(
        ["make", "test", "PYTEST_ARGS=tests/genes/test_genes_interfaces.py -k r_example"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=MAKE_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped, done.stdout  # the R examples: each one line, saying what installs R
    assert all("Rscript is not on the PATH: `make r`" in line for line in skipped), done.stdout
    assert f"{len(skipped)} skipped" in done.stdout and "failed" not in done.stdout


def test_the_slow_marker_is_declared_and_the_fast_tier_named_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert 'pytest -m "not slow"' in readme or "make test-fast" in readme
    assert "slow:" in (ROOT / "pyproject.toml").read_text()
