"""host_binding's topology parsing and CPU-set choice (the pinned child processes run on the device)."""
import pytest

from repro.bench.host_binding import cpu_sets, format_cpulist, numa_nodes, parse_cpulist


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert parse_cpulist("") == set()
    with pytest.raises(ValueError, match="not a cpulist: '0-x'"):
        parse_cpulist("0-x")


def test_numa_nodes_keep_only_allowed_cpus(tmp_path):
    for n, cpus in ((0, "0-3"), (1, "4-7"), (2, "8-9")):
        d = tmp_path / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    assert numa_nodes(tmp_path, allowed={1, 2, 5, 6}) == {0: {1, 2}, 1: {5, 6}}


def test_cpu_sets_per_node_or_halves():
    nodes = {0: {0, 1}, 1: {2, 3}}
    sets = cpu_sets(nodes, {0, 1, 2, 3}, gpu_node=1)
    assert sets == {"unpinned": {0, 1, 2, 3}, "node0": {0, 1}, "node1 (GPU's)": {2, 3}}
    assert cpu_sets({0: {0, 1, 2}}, {0, 1, 2}, None) == {"unpinned": {0, 1, 2}, "first half": {0},
                                                          "second half": {1, 2}}
    assert cpu_sets({0: {0}}, {0}, None) == {"unpinned": {0}}
