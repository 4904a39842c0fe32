"""Presets, spec validation, the cluster graph and routing."""

from __future__ import annotations

import itertools

import pytest

from topologies import (
    Cluster,
    ClusterSpec,
    TopologyError,
    build_cluster,
    load_cluster_spec,
    load_preset,
    preset_names,
)

PRESETS = ["dgx-a100", "dgx-h100"]  # the DGX presets: 8 GPUs, one NIC each


def _cluster(preset: str = "dgx-a100", nodes: int = 2, **overrides) -> Cluster:
    return build_cluster(load_cluster_spec({"preset": preset, "nodes": nodes, **overrides}))


def _custom() -> dict:
    return {
        "name": "pcie-box",
        "nodes": 3,
        "gpus_per_node": 4,
        "gpu": {
            "name": "toy",
            "peak_flops": "100 TFLOP/s",
            "hbm_bandwidth": "1 TB/s",
            "hbm_capacity": "24 GiB",
            "matmul_efficiency": 0.7,
            "attention_efficiency": 0.5,
            "kernel_launch_overhead": "5 us",
        },
        "nvswitch": {"bandwidth": "64 GB/s", "latency": "1 us"},
        "nic": {
            "per_node": 2,
            "bandwidth": "100 Gb/s",
            "latency": "1 us",
            "pcie_bandwidth": "25 GB/s",
        },
        "network": {"switch_latency": "200 ns", "oversubscription": 2},
    }


def _assert_valid_path(cluster: Cluster, src: int, dst: int) -> None:
    route = cluster.route(src, dst)
    links = [cluster.links[i] for i in route.links]
    assert links[0].src == cluster.gpu_name(src)
    assert links[-1].dst == cluster.gpu_name(dst)
    for a, b in itertools.pairwise(links):
        assert a.dst == b.src
    for link, link_id in zip(links, route.links, strict=True):
        assert link.id == link_id
        edge = cluster.graph.edges[link.src, link.dst]
        assert edge["link_id"] == link_id
        assert edge["bandwidth"] == link.bandwidth
        assert edge["latency"] == link.latency
    assert route.latency == pytest.approx(sum(link.latency for link in links))


# -- presets -------------------------------------------------------------------------


def test_preset_names():
    names = preset_names()
    assert names == sorted(names)
    assert {"cpu-localhost", "pcie-l40s", *PRESETS} <= set(names)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_yaml_has_every_field_in_human_units(preset):
    raw = load_preset(preset)
    assert raw["name"] == preset
    # an NVSwitch preset: every group but the PCIe-only and custom-topology alternatives
    assert set(raw) == set(ClusterSpec.model_fields) - {"nodes", "calibration", "pcie", "topology"}
    assert isinstance(raw["nic"]["bandwidth"], str) and raw["nic"]["bandwidth"].endswith("Gb/s")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_presets_load_and_build(preset, nodes):
    cluster = _cluster(preset, nodes)
    assert cluster.num_nodes == nodes
    assert cluster.gpus_per_node == 8
    assert cluster.num_gpus == 8 * nodes
    assert preset in cluster.describe()
    assert f"{8 * nodes} GPUs" in cluster.describe()


def test_preset_values_in_si_units():
    a100 = load_cluster_spec({"preset": "dgx-a100", "nodes": 1})
    assert a100.gpu.peak_flops == 312e12
    assert a100.gpu.hbm_capacity == 80 * 2**30
    assert a100.nvswitch.bandwidth == 300e9
    assert a100.nic.bandwidth == 25e9
    h100 = load_cluster_spec({"preset": "dgx-h100", "nodes": 1})
    assert h100.nvswitch.bandwidth == 450e9
    assert h100.nic.bandwidth == 50e9
    assert h100.gpu.hbm_bandwidth == pytest.approx(3.35e12)


def test_unknown_preset_lists_presets_and_hints():
    with pytest.raises(TopologyError) as info:
        load_cluster_spec({"preset": "dgx-a10", "nodes": 1})
    message = str(info.value)
    assert message.startswith("cluster.preset: unknown preset 'dgx-a10'")
    assert "did you mean 'dgx-a100'?" in message
    assert "dgx-h100" in message
    with pytest.raises(TopologyError, match="unknown preset 'tpu-v5'"):
        load_preset("tpu-v5")


# -- overrides and validation --------------------------------------------------------


def test_overrides_deep_merge_into_the_preset():
    preset_efficiency = load_preset("dgx-a100")["gpu"]["matmul_efficiency"]
    assert preset_efficiency != 0.6
    spec = load_cluster_spec(
        {
            "preset": "dgx-a100",
            "nodes": 4,
            "gpu": {"matmul_efficiency": 0.6},
            "nic": {"bandwidth": "100 Gb/s"},
        }
    )
    assert spec.gpu.matmul_efficiency == 0.6
    assert spec.gpu.peak_flops == 312e12  # siblings keep the preset's value
    assert spec.nic.bandwidth == 12.5e9
    assert spec.nic.pcie_bandwidth == 28e9
    assert spec.nodes == 4
    # the preset is untouched by the override
    assert load_preset("dgx-a100")["gpu"]["matmul_efficiency"] == preset_efficiency


def test_unknown_nested_key_gives_the_nearest_key():
    with pytest.raises(TopologyError) as info:
        load_cluster_spec({"preset": "dgx-a100", "nodes": 2, "gpu": {"matmul_effciency": 0.6}})
    assert str(info.value).startswith(
        "cluster.gpu.matmul_effciency: unknown key (did you mean 'matmul_efficiency'?)"
    )


@pytest.mark.parametrize("key", ["profiles", "presett", "node"])
def test_unknown_top_level_key_is_an_error(key):
    with pytest.raises(TopologyError, match=rf"^cluster\.{key}: unknown key"):
        load_cluster_spec({"preset": "dgx-a100", "nodes": 2, key: 1})


@pytest.mark.parametrize(
    ("group", "field", "value"),
    [
        ("nic", "bandwidth", "0 Gb/s"),
        ("nic", "bandwidth", "-100 Gb/s"),
        ("nic", "pcie_bandwidth", 0),
        ("nvswitch", "bandwidth", "0 GB/s"),
        ("gpu", "hbm_bandwidth", "-1 TB/s"),
        ("gpu", "hbm_capacity", "0 GB"),
    ],
)
def test_zero_or_negative_bandwidth_is_rejected_naming_the_field(group, field, value):
    with pytest.raises(TopologyError, match=rf"^cluster\.{group}\.{field}: "):
        load_cluster_spec({"preset": "dgx-h100", "nodes": 2, group: {field: value}})


def test_bad_unit_names_field_and_text():
    with pytest.raises(TopologyError) as info:
        load_cluster_spec({"preset": "dgx-h100", "nodes": 2, "nic": {"bandwidth": "450 GX/s"}})
    assert str(info.value).startswith(
        "cluster.nic.bandwidth: cannot read '450 GX/s' as a bandwidth"
    )


@pytest.mark.parametrize(
    ("config", "start"),
    [
        ({"preset": "dgx-a100", "nodes": 0}, "cluster.nodes: must be >= 1"),
        ({"preset": "dgx-a100"}, "cluster.nodes: required field is missing"),
        ({"preset": "dgx-a100", "nodes": 1, "gpu": {"matmul_efficiency": 1.2}}, "cluster.gpu"),
        ({"preset": "dgx-a100", "nodes": 1, "nic": {"per_node": 3}}, "cluster.nic.per_node"),
    ],
)
def test_other_invalid_values(config, start):
    with pytest.raises(TopologyError) as info:
        load_cluster_spec(config)
    assert str(info.value).startswith(start)
    assert "\n" not in str(info.value)


def test_prefix_is_used_in_messages():
    with pytest.raises(TopologyError, match=r"^scenario\.cluster\.nodes: "):
        load_cluster_spec({"preset": "dgx-a100", "nodes": -1}, prefix="scenario.cluster")


def test_custom_cluster_without_preset():
    spec = load_cluster_spec(_custom())
    assert spec.name == "pcie-box"
    assert spec.gpu.hbm_capacity == 24 * 2**30
    cluster = build_cluster(spec)
    assert cluster.num_gpus == 12
    assert cluster.rail_of(0) == cluster.rail_of(1) == 0
    assert cluster.rail_of(2) == cluster.rail_of(3) == 1
    for src, dst in itertools.permutations(range(cluster.num_gpus), 2):
        _assert_valid_path(cluster, src, dst)
    leaf_up = cluster.graph.edges["leaf0", "spine"]["bandwidth"]
    assert leaf_up == pytest.approx(3 * 12.5e9 / 2)


def test_custom_cluster_must_give_every_field():
    config = _custom()
    del config["network"]["switch_latency"]
    with pytest.raises(TopologyError, match="cluster.network.switch_latency: required"):
        load_cluster_spec(config)


def test_not_a_mapping():
    with pytest.raises(TopologyError, match="^cluster: expected a mapping"):
        load_cluster_spec("dgx-a100")  # type: ignore[arg-type]


# -- graph ---------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_link_counts_and_ids(nodes):
    cluster = _cluster("dgx-h100", nodes)
    per_node = 8 + 8 + 8  # gpu-nvswitch, gpu-nic, nic-leaf
    physical = nodes * per_node + 8  # plus leaf-spine, one per rail
    assert len(cluster.links) == 2 * physical
    assert cluster.graph.number_of_edges() == 2 * physical
    assert [link.id for link in cluster.links] == list(range(len(cluster.links)))
    for link in cluster.links:
        assert cluster.graph.edges[link.src, link.dst]["link_id"] == link.id
        assert cluster.graph.has_edge(link.dst, link.src)
    kinds = [kind for _, kind in cluster.graph.nodes(data="kind")]
    assert kinds.count("gpu") == 8 * nodes
    assert kinds.count("nvswitch") == nodes
    assert kinds.count("nic") == 8 * nodes
    assert kinds.count("leaf") == 8
    assert kinds.count("spine") == 1


def test_link_bandwidths():
    cluster = _cluster("dgx-h100", 4)
    spec = cluster.spec
    edges = cluster.graph.edges
    nvlink = spec.nvswitch.bandwidth * spec.nvswitch.link_efficiency
    assert edges["n1.gpu3", "n1.nvswitch"]["bandwidth"] == pytest.approx(nvlink)
    assert edges["n1.gpu3", "n1.nic3"]["bandwidth"] == spec.nic.pcie_bandwidth
    assert edges["n1.nic3", "leaf3"]["bandwidth"] == spec.nic.bandwidth
    assert edges["leaf3", "spine"]["bandwidth"] == 4 * spec.nic.bandwidth
    assert edges["spine", "leaf3"]["bandwidth"] == 4 * spec.nic.bandwidth


def test_oversubscription_thins_the_uplinks():
    cluster = _cluster("dgx-a100", 4, network={"oversubscription": 2})
    assert cluster.graph.edges["leaf0", "spine"]["bandwidth"] == 4 * 25e9 / 2
    assert "2:1 oversubscribed" in cluster.describe()


def test_numbering_is_node_major():
    cluster = _cluster("dgx-a100", 3)
    assert [cluster.node_of(g) for g in (0, 7, 8, 23)] == [0, 0, 1, 2]
    assert [cluster.local_index(g) for g in (0, 7, 8, 23)] == [0, 7, 0, 7]
    assert cluster.gpu_name(13) == "n1.gpu5"
    assert cluster.graph.nodes["n1.gpu5"]["gpu"] == 13


# -- routes --------------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("nodes", [1, 2])
def test_every_route_is_a_path_in_the_graph(preset, nodes):
    cluster = _cluster(preset, nodes)
    for src, dst in itertools.permutations(range(cluster.num_gpus), 2):
        _assert_valid_path(cluster, src, dst)


def test_routes_on_sixteen_nodes_are_paths():
    cluster = _cluster("dgx-h100", 16)
    for src in (0, 13, 127):
        for dst in range(cluster.num_gpus):
            if dst != src:
                _assert_valid_path(cluster, src, dst)


@pytest.mark.parametrize("preset", PRESETS)
def test_route_latencies(preset):
    cluster = _cluster(preset, 2)
    spec = cluster.spec
    nic, switch = spec.nic.latency, spec.network.switch_latency
    for src, dst in itertools.permutations(range(8), 2):
        assert cluster.route(src, dst).latency == spec.nvswitch.latency  # exactly
    assert cluster.route(3, 11).latency == pytest.approx(2 * nic + switch)
    assert cluster.route(3, 12).latency == pytest.approx(2 * nic + 3 * switch)


def test_route_shapes():
    cluster = _cluster("dgx-a100", 2)

    def hops(src, dst):
        route = cluster.route(src, dst)
        return [cluster.links[route.links[0]].src] + [cluster.links[i].dst for i in route.links]

    assert hops(1, 6) == ["n0.gpu1", "n0.nvswitch", "n0.gpu6"]
    assert hops(2, 10) == ["n0.gpu2", "n0.nic2", "leaf2", "n1.nic2", "n1.gpu2"]
    assert hops(2, 13) == [
        "n0.gpu2",
        "n0.nic2",
        "leaf2",
        "spine",
        "leaf5",
        "n1.nic5",
        "n1.gpu5",
    ]


def test_routes_are_cached():
    cluster = _cluster("dgx-a100", 2)
    assert cluster.route(0, 9) is cluster.route(0, 9)


def test_route_errors_name_the_numbers():
    cluster = _cluster("dgx-a100", 2)
    with pytest.raises(TopologyError, match=r"route\(3, 3\): source and destination"):
        cluster.route(3, 3)
    with pytest.raises(TopologyError, match=r"GPU 16 is out of range 0\.\.15 \(2 nodes x 8"):
        cluster.route(0, 16)
    with pytest.raises(TopologyError, match="GPU -1 is out of range"):
        cluster.route(-1, 0)
    with pytest.raises(TopologyError, match="out of range"):
        cluster.node_of(16)


def test_large_cluster_builds_quickly():
    cluster = _cluster("dgx-h100", 128)
    assert cluster.num_gpus == 1024
    _assert_valid_path(cluster, 0, 1023)


def test_cpu_localhost_builds_for_any_process_count():
    for processes in (1, 2, 3, 4):
        spec = load_cluster_spec(
            {"preset": "cpu-localhost", "nodes": 1, "gpus_per_node": processes}
        )
        cluster = build_cluster(spec)
        assert cluster.num_gpus == processes
        for src in range(processes):
            for dst in range(processes):
                if src != dst:
                    assert cluster.route(src, dst).latency == spec.nvswitch.latency


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "gb200-nvl72", "pcie-l40s"])
def test_a_fat_tree_finds_its_routes_by_numbers_as_its_path_names_them(preset):
    """The fat tree's route from where the link ids put each hop is the route its
    vertex path names, inside a node, across a leaf, across rails and across pods; all
    pairs at once (route_arrays) find the same links."""
    import random
    from itertools import pairwise

    import numpy as np

    machine = build_cluster(
        load_cluster_spec(
            {"preset": preset, "nodes": 6, "network": {"pod_size": 2, "oversubscription": 2.0}}
        )
    )
    pairs = random.Random(3).sample(
        [(a, b) for a in range(machine.num_gpus) for b in range(machine.num_gpus) if a != b], 500
    )
    by_ends = {(link.src, link.dst): link.id for link in machine.links}
    assert len(by_ends) == len(machine.links)
    for a, b in pairs:
        named = tuple(by_ends[hop] for hop in pairwise(machine._path(a, b)))
        assert machine.route(a, b).links == named
    src, dst = np.array(pairs).T
    index, links = machine.route_arrays(src, dst)
    expected = [(i, link) for i, (a, b) in enumerate(pairs) for link in machine.route_links(a, b)]
    assert list(zip(index.tolist(), links.tolist(), strict=True)) == expected


@pytest.mark.parametrize("preset", ["dgx-h100", "pcie-l40s"])
def test_a_fat_tree_s_link_table_is_the_graph_s_and_its_gpus_own_links(preset):
    """Links made from their ids agree with the graph's edges, the bandwidth array and
    each GPU's own links (the ones with it at an end)."""
    machine = build_cluster(
        load_cluster_spec({"preset": preset, "nodes": 5, "network": {"pod_size": 2}})
    )
    graph = machine.graph
    assert graph.number_of_edges() == len(machine.links)
    assert machine.bandwidths.tolist() == [link.bandwidth for link in machine.links]
    for link in machine.links:
        assert graph.edges[link.src, link.dst]["link_id"] == link.id
        at_gpu = "gpu" in (graph.nodes[link.src]["kind"], graph.nodes[link.dst]["kind"])
        assert machine.is_gpu_link(link.id) == at_gpu
    for gpu in range(machine.num_gpus):
        name = machine.gpu_name(gpu)
        mine = {link.id for link in machine.links if name in (link.src, link.dst)}
        assert machine.links_of_gpu(gpu) == mine


def test_route_links_are_the_route_s_without_keeping_it():
    machine = build_cluster(load_cluster_spec({"preset": "dgx-h100", "nodes": 3}))
    kept = machine.route(0, 17)
    assert machine.route_links(0, 17) == kept.links
    assert machine.route_links(17, 3) == machine.route(17, 3).links
    before = len(machine._routes)
    machine.route_links(5, 20)
    assert len(machine._routes) == before  # one-off: not kept
    with pytest.raises(TopologyError, match="same GPU"):
        machine.route_links(4, 4)
    with pytest.raises(TopologyError, match=r"out of range 0\.\.23"):
        machine.route_links(0, 24)
