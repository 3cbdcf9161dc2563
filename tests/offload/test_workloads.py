"""The paper's workloads (ActivePy Table I), plain Python over stored datasets, print under
``quarry run`` exactly what they print run plainly, on 3 devices: with the cut Algorithm 1
chooses, every line on the host, every line that may on the devices, and a migration of half
of every partition to the host."""

from __future__ import annotations

import pytest

from quarry.offload.run import plan
from quarry.samples import workloads

from .programs import plain, under_quarry

SCALE = 0.02
MODES = {
    "auto": {},
    "host": {"offload": "host"},
    "device": {"offload": "device"},
    "migrated": {"offload": "device", "migrate": "force"},
}


@pytest.fixture(scope="module")
def stored(cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("workloads")
    paths = workloads.write(folder, SCALE)
    names = [f"workloads/{stem}" for stem in paths]
    for stem, path in paths.items():
        cluster.ingest(str(path), f"workloads/{stem}", partitions=4)
    yield folder
    for name in names:
        cluster.drop(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(workloads.PROGRAMS))
def test_a_workload_prints_what_it_prints_plainly_whatever_the_cut(stored, cluster, name):
    script, args = workloads.script(name), workloads.argv(name, stored)
    expected = plain(script, args)
    planned = plan(script, cluster, args)
    offloaded = {}
    for mode, options in MODES.items():
        report: list = []
        printed = under_quarry(script, cluster, args, planned=planned, report=report, **options)
        assert printed == expected, mode
        offloaded[mode] = report
    assert not offloaded["host"]
    assert offloaded["device"], "every workload has lines that run on the devices"
    assert all(part.migrations for part in offloaded["migrated"])
