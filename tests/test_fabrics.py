"""Fabrics beyond one pod of NVSwitch nodes: pods and a core, PCIe-only nodes, custom
topologies per dimension and as explicit graphs, and their validation errors."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import networkx as nx
import pytest
import yaml

from topologies import (
    Cluster,
    DimensionCluster,
    FatTreeCluster,
    GraphCluster,
    TopologyError,
    build_cluster,
    load_cluster_spec,
    load_preset,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "topologies" / "examples"
SWITCH_RING = "examples/switch-ring-2d.yaml"
GRAPH = "examples/bridged-pairs-graph.yaml"


def _cluster(config: dict) -> Cluster:
    return build_cluster(load_cluster_spec(config))


def _hops(cluster: Cluster, src: int, dst: int) -> list[str]:
    route = cluster.route(src, dst)
    return [cluster.links[route.links[0]].src] + [cluster.links[i].dst for i in route.links]


def _assert_valid_path(cluster: Cluster, src: int, dst: int) -> None:
    route = cluster.route(src, dst)
    links = [cluster.links[i] for i in route.links]
    assert links[0].src == cluster.gpu_name(src)
    assert links[-1].dst == cluster.gpu_name(dst)
    for a, b in itertools.pairwise(links):
        assert a.dst == b.src
    for link, link_id in zip(links, route.links, strict=True):
        edge = cluster.graph.edges[link.src, link.dst]
        assert edge["link_id"] == link_id == link.id
        assert edge["bandwidth"] == link.bandwidth
        assert edge["latency"] == link.latency
    assert route.latency == pytest.approx(sum(link.latency for link in links))


def _error(config: dict, **kwargs) -> str:
    with pytest.raises(TopologyError) as info:
        load_cluster_spec(config, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- pods and oversubscription -------------------------------------------------------


def _pods(nodes: int = 5, pod_size: int = 2, **network) -> FatTreeCluster:
    cluster = _cluster(
        {"preset": "dgx-h100", "nodes": nodes, "network": {"pod_size": pod_size, **network}}
    )
    assert isinstance(cluster, FatTreeCluster)
    return cluster


def test_one_pod_by_default_keeps_plain_names_and_no_core():
    for network in ({}, {"pod_size": 4}, {"pod_size": 64}):
        cluster = _cluster({"preset": "dgx-a100", "nodes": 4, "network": network})
        assert cluster.num_pods == 1
        assert cluster.graph.has_node("leaf3") and cluster.graph.has_node("spine")
        assert not cluster.graph.has_node("core")
        assert cluster.pod_of(31) == 0


def test_pod_vertices_and_numbering():
    cluster = _pods(nodes=5, pod_size=2)
    assert cluster.num_pods == 3
    assert [cluster.nodes_in_pod(p) for p in range(3)] == [2, 2, 1]
    assert [cluster.pod_of(g) for g in (0, 15, 16, 31, 32, 39)] == [0, 0, 1, 1, 2, 2]
    kinds = [kind for _, kind in cluster.graph.nodes(data="kind")]
    assert kinds.count("leaf") == 3 * 8
    assert kinds.count("spine") == 3
    assert kinds.count("core") == 1
    for pod in range(3):
        assert cluster.graph.has_node(f"pod{pod}.spine")
        assert cluster.graph.has_edge(f"pod{pod}.leaf7", f"pod{pod}.spine")
        assert cluster.graph.has_edge(f"pod{pod}.spine", "core")
    assert cluster.graph.has_edge("n2.nic5", "pod1.leaf5")
    assert not cluster.graph.has_node("leaf0")


def test_pod_routes():
    cluster = _pods(nodes=5, pod_size=2)
    # same pod, same rail: the pod's leaf only
    assert _hops(cluster, 2, 10) == ["n0.gpu2", "n0.nic2", "pod0.leaf2", "n1.nic2", "n1.gpu2"]
    # same pod, other rail: leaf -> pod spine -> leaf
    assert _hops(cluster, 2, 13) == [
        "n0.gpu2", "n0.nic2", "pod0.leaf2", "pod0.spine", "pod0.leaf5", "n1.nic5", "n1.gpu5",
    ]  # fmt: skip
    # other pod, even on the same rail: through the core
    assert _hops(cluster, 2, 34) == [
        "n0.gpu2", "n0.nic2", "pod0.leaf2", "pod0.spine", "core", "pod2.spine", "pod2.leaf2",
        "n4.nic2", "n4.gpu2",
    ]  # fmt: skip
    assert _hops(cluster, 17, 7)[3:6] == ["pod1.spine", "core", "pod0.spine"]
    assert _hops(cluster, 1, 6) == ["n0.gpu1", "n0.nvswitch", "n0.gpu6"]


def test_pod_route_latencies():
    cluster = _pods(nodes=4, pod_size=2)
    nic, switch = cluster.spec.nic.latency, cluster.spec.network.switch_latency
    assert cluster.route(3, 11).latency == pytest.approx(2 * nic + switch)
    assert cluster.route(3, 12).latency == pytest.approx(2 * nic + 3 * switch)
    assert cluster.route(3, 19).latency == pytest.approx(2 * nic + 5 * switch)
    assert cluster.route(3, 28).latency == pytest.approx(2 * nic + 5 * switch)


def test_pod_bandwidths_with_oversubscription():
    cluster = _pods(nodes=5, pod_size=2, oversubscription=2, core_oversubscription=4)
    nic = cluster.spec.nic.bandwidth
    edges = cluster.graph.edges
    assert edges["n0.nic3", "pod0.leaf3"]["bandwidth"] == nic
    # leaf -> spine: nodes in the pod x NIC rate / oversubscription
    assert edges["pod0.leaf3", "pod0.spine"]["bandwidth"] == pytest.approx(2 * nic / 2)
    assert edges["pod0.spine", "pod0.leaf3"]["bandwidth"] == pytest.approx(2 * nic / 2)
    assert edges["pod2.leaf3", "pod2.spine"]["bandwidth"] == pytest.approx(1 * nic / 2)
    # spine -> core: the pod's leaf uplinks together / core oversubscription
    assert edges["pod1.spine", "core"]["bandwidth"] == pytest.approx(8 * 2 * nic / 2 / 4)
    assert edges["core", "pod2.spine"]["bandwidth"] == pytest.approx(8 * 1 * nic / 2 / 4)
    assert "3 pods" in cluster.describe() and "4:1 oversubscribed" in cluster.describe()


def test_pod_core_is_non_blocking_by_default():
    cluster = _pods(nodes=4, pod_size=2)
    nic = cluster.spec.nic.bandwidth
    assert cluster.graph.edges["pod0.spine", "core"]["bandwidth"] == pytest.approx(8 * 2 * nic)


def test_every_pod_route_is_a_path():
    cluster = _cluster({"preset": "dgx-a100", "nodes": 3, "network": {"pod_size": 2}})
    for src, dst in itertools.permutations(range(cluster.num_gpus), 2):
        _assert_valid_path(cluster, src, dst)
    physical = 3 * (8 + 8 + 8) + 2 * 8 + 2  # nodes, leaf-spine per pod and rail, spine-core
    assert len(cluster.links) == 2 * physical


def test_large_cluster_in_superpod_scalable_units_builds_quickly():
    cluster = _pods(nodes=128, pod_size=32)
    assert cluster.num_gpus == 1024 and cluster.num_pods == 4
    _assert_valid_path(cluster, 0, 1023)
    assert len(cluster._routes) == 1  # routes are computed on demand


@pytest.mark.parametrize(
    ("network", "start"),
    [
        ({"pod_size": 0}, "cluster.network.pod_size: must be >= 1"),
        ({"pod_size": True}, "cluster.network.pod_size: "),
        ({"core_oversubscription": 0}, "cluster.network.core_oversubscription: must be > 0"),
        ({"pod_sise": 2}, "cluster.network.pod_sise: unknown key (did you mean 'pod_size'?)"),
    ],
)
def test_pod_fields_are_validated(network, start):
    assert _error({"preset": "dgx-h100", "nodes": 4, "network": network}).startswith(start)


# -- PCIe nodes ----------------------------------------------------------------------


def _pcie(nodes: int = 2, **pcie) -> Cluster:
    group = {"bandwidth": "28 GB/s", "latency": "1 us", "gpus_per_switch": 2, **pcie}
    return _cluster({"preset": "dgx-a100", "nodes": nodes, "nvswitch": None, "pcie": group})


def test_pcie_node_routes():
    cluster = _pcie()
    assert cluster.intra_node_link == "pci"
    assert cluster.has_nvls is False
    assert _hops(cluster, 0, 1) == ["n0.gpu0", "n0.pcie0", "n0.gpu1"]
    assert _hops(cluster, 9, 14) == ["n1.gpu1", "n1.pcie0", "n1.cpu", "n1.pcie3", "n1.gpu6"]
    assert _hops(cluster, 2, 10)[1:3] == ["n0.nic2", "leaf2"]  # leaving the node as before
    for src, dst in itertools.permutations(range(cluster.num_gpus), 2):
        _assert_valid_path(cluster, src, dst)
    kinds = [kind for _, kind in cluster.graph.nodes(data="kind")]
    assert kinds.count("pcie_switch") == 2 * 4 and kinds.count("cpu") == 2
    assert "nvswitch" not in kinds


def test_pcie_node_latencies_and_bandwidths():
    cluster = _pcie(host_latency="3 us", host_bandwidth="16 GB/s")
    assert cluster.route(0, 1).latency == pytest.approx(1e-6)
    assert cluster.route(0, 2).latency == pytest.approx(2 * 1e-6 + 3e-6)
    edges = cluster.graph.edges
    assert edges["n0.gpu3", "n0.pcie1"]["bandwidth"] == 28e9
    assert edges["n0.pcie1", "n0.cpu"]["bandwidth"] == 16e9
    default = _pcie()
    assert default.route(0, 7).latency == pytest.approx(3e-6)  # host bridge = one more hop
    assert default.graph.edges["n0.cpu", "n0.pcie3"]["bandwidth"] == 28e9


def test_nvswitch_nodes_report_nvlink_and_their_nvls():
    h100 = _cluster({"preset": "dgx-h100", "nodes": 1})
    a100 = _cluster({"preset": "dgx-a100", "nodes": 1})
    assert h100.intra_node_link == a100.intra_node_link == "nvlink"
    assert h100.has_nvls is True and a100.has_nvls is False


def test_l40s_preset():
    raw = load_preset("pcie-l40s")
    assert "nvswitch" not in raw and raw["pcie"]["gpus_per_switch"] == 2
    spec = load_cluster_spec({"preset": "pcie-l40s", "nodes": 2})
    assert spec.nvswitch is None
    assert spec.gpu.peak_flops == pytest.approx(362.05e12)
    assert spec.gpu.hbm_bandwidth == 864e9
    assert spec.gpu.hbm_capacity == 48 * 2**30
    assert spec.pcie.bandwidth == 28e9 and spec.pcie.latency == 1e-6
    assert spec.nic.per_node == 2 and spec.nic.bandwidth == 50e9
    cluster = build_cluster(spec)
    assert cluster.num_gpus == 16
    assert cluster.intra_node_link == "pci" and not cluster.has_nvls
    assert [cluster.rail_of(g) for g in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert _hops(cluster, 0, 12) == [
        "n0.gpu0", "n0.nic0", "leaf0", "spine", "leaf1", "n1.nic1", "n1.gpu4",
    ]  # fmt: skip
    for src, dst in itertools.permutations(range(cluster.num_gpus), 2):
        _assert_valid_path(cluster, src, dst)
    assert "no NVLink" in cluster.describe()


def test_nvswitch_and_pcie_exclude_each_other():
    pcie = {"bandwidth": "28 GB/s", "latency": "1 us", "gpus_per_switch": 2}
    both = _error({"preset": "dgx-a100", "nodes": 1, "pcie": pcie})
    assert both.startswith("cluster.pcie: give exactly one of nvswitch")
    neither = _error({"preset": "dgx-a100", "nodes": 1, "nvswitch": None})
    assert neither.startswith("cluster.nvswitch: required field is missing")


@pytest.mark.parametrize(
    ("pcie", "start"),
    [
        ({"gpus_per_switch": 3}, "cluster.pcie.gpus_per_switch: gpus_per_switch(3) must divide"),
        ({"bandwidth": "0 GB/s"}, "cluster.pcie.bandwidth: must be > 0"),
        ({"host_bandwidth": 0}, "cluster.pcie.host_bandwidth: must be > 0"),
        ({"gpus_per_swich": 2}, "cluster.pcie.gpus_per_swich: unknown key (did you mean"),
    ],
)
def test_pcie_fields_are_validated(pcie, start):
    group = {"bandwidth": "28 GB/s", "latency": "1 us", "gpus_per_switch": 2, **pcie}
    config = {"preset": "dgx-a100", "nodes": 1, "nvswitch": None, "pcie": group}
    assert _error(config).startswith(start)


# -- custom topologies: per dimension ------------------------------------------------


def _dims(*dims, **extra) -> dict:
    rows = [
        {"kind": kind, "size": size, "bandwidth": "100 GB/s", "latency": f"{lat} us"}
        for kind, size, lat in dims
    ]
    return {"topology": {"gpu_preset": "dgx-h100", "dimensions": rows, **extra}}


def _expected_hops(cluster: DimensionCluster, src: int, dst: int) -> int:
    hops = 0
    for k, dim in enumerate(cluster.dimensions):
        a, b = cluster.coordinate(src, k), cluster.coordinate(dst, k)
        if a != b:
            distance = (b - a) % dim.size
            hops += 2 if dim.kind == "switch" else min(distance, dim.size - distance)
    return hops


def test_switch_ring_example():
    cluster = _cluster({"topology": SWITCH_RING})
    assert isinstance(cluster, DimensionCluster)
    spec = cluster.spec
    assert spec.name == "switch-ring-2d"
    assert (cluster.num_gpus, cluster.gpus_per_node, cluster.num_nodes) == (16, 4, 4)
    assert (spec.nodes, spec.gpus_per_node) == (4, 4)  # what the simulator reads
    assert spec.gpu == load_cluster_spec({"preset": "dgx-h100", "nodes": 1}).gpu
    assert [cluster.node_of(g) for g in (0, 3, 4, 15)] == [0, 0, 1, 3]
    assert cluster.coordinates(9) == (1, 2)
    assert cluster.intra_node_link == "nvlink" and cluster.has_nvls is False
    # inside a node: up and down the node's switch
    assert _hops(cluster, 0, 3) == ["n0.gpu0", "dim0.switch0", "n0.gpu3"]
    # (0,0) -> (1,2): the switch, then two ring hops (a tie goes the ascending way)
    assert _hops(cluster, 0, 9) == ["n0.gpu0", "dim0.switch0", "n0.gpu1", "n1.gpu1", "n2.gpu1"]
    # (0,0) -> (0,3): one ring hop backwards
    assert _hops(cluster, 0, 12) == ["n0.gpu0", "n3.gpu0"]
    dims = spec.topology.dimensions
    assert cluster.route(0, 9).latency == pytest.approx(dims[0].latency + 2 * dims[1].latency)
    assert cluster.route(0, 12).latency == pytest.approx(dims[1].latency)
    for src, dst in itertools.permutations(range(16), 2):
        _assert_valid_path(cluster, src, dst)
        assert len(cluster.route(src, dst).links) == _expected_hops(cluster, src, dst)


def test_switch_ring_links():
    cluster = _cluster({"topology": SWITCH_RING})
    dims = cluster.spec.topology.dimensions
    kinds = [kind for _, kind in cluster.graph.nodes(data="kind")]
    assert kinds.count("gpu") == 16 and kinds.count("switch") == 4
    assert len(cluster.links) == 2 * (16 + 16)  # GPU-switch, and one ring link per GPU
    edge = cluster.graph.edges["n1.gpu2", "n2.gpu2"]
    assert edge["bandwidth"] == dims[1].bandwidth and edge["latency"] == dims[1].latency
    assert cluster.graph.has_edge("n0.gpu2", "n3.gpu2")  # the ring wraps around
    assert cluster.graph.edges["n1.gpu2", "dim0.switch1"]["bandwidth"] == dims[0].bandwidth


def test_three_dimensions_and_outer_switch():
    cluster = _cluster(_dims(("switch", 2, 1), ("ring", 3, 2), ("switch", 2, 4)))
    assert (cluster.num_gpus, cluster.gpus_per_node, cluster.num_nodes) == (12, 2, 6)
    # (1,2,1) -> (0,0,0): switch of dim 0, one ring hop (2 -> 0 forward), switch of dim 2
    assert _hops(cluster, 11, 0) == [
        "n5.gpu1", "dim0.switch5", "n5.gpu0", "n3.gpu0", "dim2.switch0", "n0.gpu0",
    ]  # fmt: skip
    assert cluster.route(11, 0).latency == pytest.approx((1 + 2 + 4) * 1e-6)
    for src, dst in itertools.permutations(range(12), 2):
        _assert_valid_path(cluster, src, dst)
        assert len(cluster.route(src, dst).links) == _expected_hops(cluster, src, dst)


def test_a_ring_of_two_is_one_link_and_size_one_has_none():
    cluster = _cluster(_dims(("switch", 2, 1), ("ring", 2, 1), ("ring", 1, 1)))
    assert len(cluster.links) == 2 * (4 + 2)
    assert _hops(cluster, 0, 2) == ["n0.gpu0", "n1.gpu0"]


def test_large_dimension_cluster_builds_quickly():
    cluster = _cluster(_dims(("switch", 8, 1), ("ring", 16, 1), ("ring", 8, 1)))
    assert cluster.num_gpus == 1024
    _assert_valid_path(cluster, 0, 1023)
    assert len(cluster.route(0, 1023).links) == 2 + 1 + 1


def test_inline_topology_with_overrides_and_flags():
    config = _dims(("switch", 4, 1), intra_node_link="pci", nvls=True, name="box")
    config["gpu"] = {"matmul_efficiency": 0.5}
    config["nodes"] = 1
    spec = load_cluster_spec(config)
    assert spec.name == "box" and spec.gpu.matmul_efficiency == 0.5
    assert spec.gpu.peak_flops == pytest.approx(989.4e12)  # the rest from gpu_preset
    cluster = build_cluster(spec)
    assert cluster.intra_node_link == "pci" and cluster.has_nvls is True


def test_cluster_of_spec_builds_the_matching_fabric():
    assert isinstance(build_cluster(load_cluster_spec({"topology": SWITCH_RING})), DimensionCluster)
    assert isinstance(build_cluster(load_cluster_spec({"topology": GRAPH})), GraphCluster)
    assert isinstance(
        build_cluster(load_cluster_spec({"preset": "dgx-a100", "nodes": 1})), FatTreeCluster
    )


def test_topology_paths_resolve(tmp_path, monkeypatch):
    text = (EXAMPLES / "switch-ring-2d.yaml").read_text()
    (tmp_path / "mine.yaml").write_text(text)
    assert load_cluster_spec({"topology": str(tmp_path / "mine.yaml")}).name == "switch-ring-2d"
    assert load_cluster_spec({"topology": "mine.yaml"}, base_dir=tmp_path).nodes == 4
    monkeypatch.chdir(tmp_path)
    assert load_cluster_spec({"topology": "mine.yaml"}).nodes == 4
    assert load_cluster_spec({"topology": SWITCH_RING}).nodes == 4  # the package's examples


# -- custom topologies: explicit graph -----------------------------------------------


def _graph(devices, links, gpus_per_node=1, **extra) -> dict:
    return {
        "topology": {
            "gpu_preset": "dgx-h100",
            "gpus_per_node": gpus_per_node,
            "devices": [{"name": n, "kind": k} for n, k in devices],
            "links": [
                {"a": a, "b": b, "bandwidth": "10 GB/s", "latency": f"{lat} us", **more}
                for a, b, lat, *rest in links
                for more in [rest[0] if rest else {}]
            ],
            **extra,
        }
    }


def test_graph_example():
    cluster = _cluster({"topology": GRAPH})
    assert isinstance(cluster, GraphCluster)
    assert (cluster.num_gpus, cluster.gpus_per_node, cluster.num_nodes) == (4, 2, 2)
    assert [cluster.gpu_name(g) for g in range(4)] == ["a0", "a1", "b0", "b1"]
    assert [cluster.node_of(g) for g in range(4)] == [0, 0, 1, 1]
    assert cluster.graph.nodes["b0"]["gpu"] == 2
    assert cluster.intra_node_link == "pci"
    assert cluster.spec.gpu.name == "L40S-48GB"
    assert _hops(cluster, 0, 1) == ["a0", "a1"]  # the bridge beats the PCIe switch
    assert _hops(cluster, 0, 3) == ["a0", "a.pcie", "a.nic", "tor", "b.nic", "b.pcie", "b1"]
    assert cluster.route(0, 3).latency == pytest.approx((0.5 + 0.3 + 0.4 + 0.4 + 0.3 + 0.5) * 1e-6)


def test_graph_routes_are_shortest_valid_paths():
    cluster = _cluster({"topology": GRAPH})
    for src, dst in itertools.permutations(range(cluster.num_gpus), 2):
        _assert_valid_path(cluster, src, dst)
        best = nx.shortest_path_length(
            cluster.graph, cluster.gpu_name(src), cluster.gpu_name(dst), weight="latency"
        )
        assert cluster.route(src, dst).latency == pytest.approx(best)
    assert cluster.route(0, 3) is cluster.route(0, 3)


def test_graph_ties_prefer_fewer_hops_and_are_deterministic():
    devices = [("g0", "gpu"), ("g1", "gpu"), ("s", "switch"), ("t", "switch")]
    links = [("g0", "s", 0.5), ("s", "g1", 0.5), ("g0", "t", 0.25), ("t", "g1", 0.75)]
    two_hop = _hops(_cluster(_graph(devices, links)), 0, 1)
    assert two_hop in (["g0", "s", "g1"], ["g0", "t", "g1"])
    for _ in range(3):  # the same file always gives the same route
        assert _hops(_cluster(_graph(devices, links)), 0, 1) == two_hop
    direct = _cluster(_graph(devices, [*links, ("g0", "g1", 1.0)]))
    assert _hops(direct, 0, 1) == ["g0", "g1"]  # equal latency: fewer hops
    assert direct.route(0, 1).latency == pytest.approx(1e-6)


def test_graph_one_way_links():
    devices = [("g0", "gpu"), ("g1", "gpu"), ("g2", "gpu")]
    one_way = {"bidirectional": False}
    links = [("g0", "g1", 1, one_way), ("g1", "g2", 1, one_way), ("g2", "g0", 1, one_way)]
    cluster = _cluster(_graph(devices, links))
    assert len(cluster.links) == 3
    assert _hops(cluster, 1, 0) == ["g1", "g2", "g0"]
    assert cluster.route(1, 0).latency == pytest.approx(2e-6)


# -- validation of custom topologies ---------------------------------------------------


def test_disconnected_graph_names_both_gpus():
    devices = [("g0", "gpu"), ("g1", "gpu"), ("g2", "gpu"), ("s", "switch")]
    message = _error(_graph(devices, [("g0", "s", 1), ("g1", "s", 1)]))
    assert message == (
        "cluster.topology.links: no route from GPU 0 ('g0') to GPU 2 ('g2'); every GPU must "
        "reach every other"
    )
    one_way = _graph(devices[:2], [("g0", "g1", 1, {"bidirectional": False})])
    assert "no route from GPU 1 ('g1') to GPU 0 ('g0')" in _error(one_way)


@pytest.mark.parametrize("bandwidth", [0, "0 GB/s", "-5 GB/s"])
def test_graph_link_bandwidth_must_be_positive_and_names_the_link(bandwidth):
    config = _graph([("g0", "gpu"), ("g1", "gpu")], [("g0", "g1", 1)])
    config["topology"]["links"][0]["bandwidth"] = bandwidth
    message = _error(config)
    assert message.startswith("cluster.topology.links[0].bandwidth: ")
    assert message.endswith("on link g0 <-> g1")


def test_dimension_bandwidth_must_be_positive():
    config = _dims(("switch", 4, 1), ("ring", 2, 1))
    config["topology"]["dimensions"][1]["bandwidth"] = "0 GB/s"
    assert _error(config).startswith("cluster.topology.dimensions[1].bandwidth: must be > 0")


def test_duplicate_device_name():
    devices = [("g0", "gpu"), ("s", "switch"), ("g0", "gpu")]
    message = _error(_graph(devices, [("g0", "s", 1)]))
    assert message == (
        "cluster.topology.devices[2].name: duplicate device name 'g0' (first at devices[0])"
    )


def test_link_to_unknown_device():
    devices = [("g0", "gpu"), ("g1", "gpu"), ("sw0", "switch")]
    message = _error(_graph(devices, [("g0", "sw0", 1), ("g1", "sw9", 1)]))
    assert message == (
        "cluster.topology.links[1].b: unknown device 'sw9' (did you mean 'sw0'?) (link g1 <-> sw9)"
    )


def test_duplicate_and_self_links():
    devices = [("g0", "gpu"), ("g1", "gpu")]
    duplicate = _error(_graph(devices, [("g0", "g1", 1), ("g1", "g0", 2)]))
    assert duplicate == ("cluster.topology.links[1]: duplicate link g1 -> g0 (also in links[0])")
    assert _error(_graph(devices, [("g0", "g0", 1)])) == (
        "cluster.topology.links[0]: link from 'g0' to itself"
    )


def test_sizes_must_multiply_to_the_gpu_count():
    declared = _dims(("switch", 4, 1), ("ring", 4, 1), gpus=12)
    assert _error(declared) == (
        "cluster.topology.dimensions: sizes 4 x 4 = 16 GPUs, but gpus is 12"
    )
    nodes = {**_dims(("switch", 4, 1), ("ring", 4, 1)), "nodes": 3}
    assert _error(nodes) == (
        "cluster.nodes: nodes(3) does not match the topology, which has 16 GPUs on 4 nodes of 4"
    )
    per_node = _dims(("switch", 4, 1), ("ring", 4, 1), gpus_per_node=8)
    assert _error(per_node).startswith(
        "cluster.topology.gpus_per_node: gpus_per_node(8) != dimensions[0].size(4)"
    )


def test_graph_gpu_count_checks():
    devices = [("g0", "gpu"), ("g1", "gpu"), ("g2", "gpu")]
    links = [("g0", "g1", 1), ("g1", "g2", 1)]
    assert _error(_graph(devices, links, gpus_per_node=2)) == (
        "cluster.topology.gpus_per_node: gpus_per_node(2) must divide the 3 devices of kind gpu"
    )
    assert _error(_graph(devices, links, gpus=4)) == (
        "cluster.topology.devices: 3 devices of kind gpu, but gpus is 4"
    )
    assert (
        _error(_graph([("s", "switch")], [])) == "cluster.topology.devices: no device of kind gpu"
    )
    config = _graph(devices, links)
    del config["topology"]["gpus_per_node"]
    assert _error(config).startswith("cluster.topology.gpus_per_node: required field is missing")


@pytest.mark.parametrize(
    ("change", "start"),
    [
        ({"dimensons": []}, "cluster.topology.dimensons: unknown key (did you mean 'dimensions'?)"),
        ({"gpu_presets": "x"}, "cluster.topology.gpu_presets: unknown key (did you mean"),
        ({"intra_node_link": "infiniband"}, "cluster.topology.intra_node_link: "),
    ],
)
def test_unknown_and_bad_topology_keys(change, start):
    config = _dims(("switch", 4, 1))
    config["topology"].update(change)
    assert _error(config).startswith(start)


def test_unknown_keys_inside_entries_get_hints():
    dims = _dims(("switch", 4, 1))
    dims["topology"]["dimensions"][0]["sise"] = 4
    assert _error(dims).startswith(
        "cluster.topology.dimensions[0].sise: unknown key (did you mean 'size'?)"
    )
    graph = _graph([("g0", "gpu"), ("g1", "gpu")], [("g0", "g1", 1)])
    graph["topology"]["links"][0]["bandwith"] = "1 GB/s"
    assert _error(graph).startswith(
        "cluster.topology.links[0].bandwith: unknown key (did you mean 'bandwidth'?)"
    )
    kind = _dims(("torus", 4, 1))
    assert _error(kind).startswith("cluster.topology.dimensions[0].kind: ")


def test_one_form_only():
    both = _dims(("switch", 1, 1), devices=[{"name": "g0", "kind": "gpu"}], links=[])
    assert _error(both).startswith("cluster.topology: give either dimensions")
    neither = {"topology": {"gpu_preset": "dgx-h100"}}
    assert _error(neither).startswith("cluster.topology: required field is missing")
    no_links = _graph([("g0", "gpu")], [])
    del no_links["topology"]["links"]
    assert _error(no_links).startswith("cluster.topology.links: required field is missing")


def test_topology_does_not_combine_with_preset_groups():
    for key, value in [("preset", "dgx-h100"), ("nic", {}), ("network", {}), ("nvswitch", {})]:
        message = _error({"topology": SWITCH_RING, key: value})
        assert message.startswith(f"cluster.{key}: not used with cluster.topology")


def test_gpu_must_come_from_somewhere():
    config = _dims(("switch", 2, 1))
    del config["topology"]["gpu_preset"]
    assert _error(config).startswith("cluster.topology.gpu: required field is missing")
    config["topology"]["gpu_preset"] = "dgx-h10"
    assert _error(config).startswith(
        "cluster.topology.gpu_preset: unknown preset 'dgx-h10' (did you mean"
    )


def test_missing_or_broken_topology_file(tmp_path):
    assert _error({"topology": "no/such/file.yaml"}).startswith(
        "cluster.topology: cannot find topology file 'no/such/file.yaml'"
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text("dimensions: [\n")
    assert _error({"topology": str(broken)}).startswith("cluster.topology: ")
    listing = tmp_path / "list.yaml"
    listing.write_text(yaml.safe_dump([1, 2]))
    assert "expected a mapping" in _error({"topology": str(listing)})


def test_examples_are_documented_and_small():
    for path in EXAMPLES.glob("*.yaml"):
        text = path.read_text()
        assert text.startswith("#")
        spec = load_cluster_spec({"topology": str(path)})
        assert spec.name == path.stem
        assert math.prod([spec.nodes, spec.gpus_per_node]) <= 64
