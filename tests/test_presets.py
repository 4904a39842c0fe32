"""Every shipped cluster preset: it builds, its numbers are the datasheets', and NCCL's
model gives bus bandwidths that its links can carry."""

from __future__ import annotations

import pytest

from simulator.engine.collectives import plan_collective
from topologies import (
    build_cluster,
    load_cluster_spec,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    preset_names,
)

GiB = 2**30
ALL_REDUCE_SIZE = 8 * GiB

# The numbers each new preset takes from its datasheet, in the units the documents use.
# ``datasheet_gib`` is the per-GPU memory the datasheet prints as "GB" (binary); the
# preset holds what nvidia-smi reports, a little below it.
DATASHEET = {
    "hgx-h200": {
        "gpus_per_node": 8,
        "peak_flops": "989.4 TFLOP/s",
        "hbm_bandwidth": "4.8 TB/s",
        "hbm_capacity": "143771 MiB",
        "datasheet_gib": 141,
        "nvlink_per_direction": "450 GB/s",
        "link_efficiency": 0.824,
        "nics": 8,
        "nic_bandwidth": "400 Gb/s",
    },
    "dgx-b200": {
        "gpus_per_node": 8,
        "peak_flops": "2.25 PFLOP/s",
        "hbm_bandwidth": "8 TB/s",
        "hbm_capacity": "183359 MiB",
        "datasheet_gib": 180,
        "nvlink_per_direction": "900 GB/s",
        "link_efficiency": 0.802,
        "nics": 8,
        "nic_bandwidth": "400 Gb/s",
    },
    "gb200-nvl72": {
        "gpus_per_node": 72,
        "peak_flops": "2.5 PFLOP/s",
        "hbm_bandwidth": "8 TB/s",
        "hbm_capacity": "189471 MiB",
        "datasheet_gib": 186,
        "nvlink_per_direction": "900 GB/s",
        "link_efficiency": 0.802,
        "nics": 72,
        "nic_bandwidth": "400 Gb/s",
    },
}

# System totals as the platform documents print them, which the per-GPU numbers must
# multiply back to: sparse BF16 FLOP/s (twice dense), HBM bandwidth, NVLink bandwidth
# (both directions).
PLATFORM_TOTALS = {
    # 8x the NVIDIA H200 datasheet's per GPU: 1,979 TFLOPS BF16 with sparsity, 4.8 TB/s,
    # NVLink 900 GB/s.
    "hgx-h200": {"sparse_bf16": "15.83 PFLOP/s", "hbm": "38.4 TB/s", "nvlink": "7.2 TB/s"},
    # HGX B200: 36 PFLOPS FP16/BF16 with sparsity; DGX B200: 64 TB/s HBM3e, 14.4 TB/s NVLink.
    "dgx-b200": {"sparse_bf16": "36 PFLOP/s", "hbm": "64 TB/s", "nvlink": "14.4 TB/s"},
    # GB200 NVL72: 360 PFLOPS FP16/BF16 with sparsity, 576 TB/s HBM3e, 130 TB/s NVLink.
    "gb200-nvl72": {"sparse_bf16": "360 PFLOP/s", "hbm": "576 TB/s", "nvlink": "130 TB/s"},
}


def _cluster(preset: str, nodes: int):
    return build_cluster(load_cluster_spec({"preset": preset, "nodes": nodes}))


def test_the_new_presets_ship():
    assert set(DATASHEET) <= set(preset_names())


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_loads_and_builds(preset, nodes):
    spec = load_cluster_spec({"preset": preset, "nodes": nodes})
    assert spec.name == preset
    cluster = build_cluster(spec)
    assert cluster.num_gpus == nodes * spec.gpus_per_node
    last = cluster.num_gpus - 1
    route = cluster.route(0, last)
    assert route.links and route.latency > 0


@pytest.mark.parametrize("preset", sorted(DATASHEET))
def test_new_presets_carry_the_datasheet_numbers(preset):
    want = DATASHEET[preset]
    spec = load_cluster_spec({"preset": preset, "nodes": 1})
    assert spec.gpus_per_node == want["gpus_per_node"]
    assert spec.gpu.peak_flops == pytest.approx(parse_flops(want["peak_flops"]))
    assert spec.gpu.hbm_bandwidth == pytest.approx(parse_bandwidth(want["hbm_bandwidth"]))
    assert spec.gpu.hbm_capacity == pytest.approx(parse_bytes(want["hbm_capacity"]))
    # nvidia-smi's figure sits within 1% below the datasheet's (binary) GB
    datasheet = want["datasheet_gib"] * GiB
    assert 0.99 * datasheet <= spec.gpu.hbm_capacity <= datasheet
    assert spec.nvswitch.bandwidth == pytest.approx(parse_bandwidth(want["nvlink_per_direction"]))
    assert spec.nvswitch.link_efficiency == pytest.approx(want["link_efficiency"])
    assert spec.nvswitch.nvls is True
    assert spec.nic.per_node == want["nics"]
    assert spec.nic.bandwidth == pytest.approx(parse_bandwidth(want["nic_bandwidth"]))
    assert spec.network.oversubscription == 1.0


@pytest.mark.parametrize("preset", sorted(PLATFORM_TOTALS))
def test_per_gpu_numbers_multiply_back_to_the_platform_totals(preset):
    totals = PLATFORM_TOTALS[preset]
    spec = load_cluster_spec({"preset": preset, "nodes": 1})
    gpus = spec.gpus_per_node
    assert 2 * gpus * spec.gpu.peak_flops == pytest.approx(
        parse_flops(totals["sparse_bf16"]), rel=0.01
    )
    assert gpus * spec.gpu.hbm_bandwidth == pytest.approx(parse_bandwidth(totals["hbm"]), rel=0.01)
    assert 2 * gpus * spec.nvswitch.bandwidth == pytest.approx(
        parse_bandwidth(totals["nvlink"]), rel=0.01
    )


@pytest.mark.parametrize("preset", preset_names())
def test_one_node_all_reduce_runs_near_the_nvlink_rate(preset):
    """An 8 GiB all-reduce on every GPU of one node: NCCL's bus bandwidth is of the order
    of one GPU's NVLink rate per direction (NVLS may exceed it, packet overheads take
    some of it)."""
    cluster = _cluster(preset, 1)
    choice = plan_collective(
        cluster, "all_reduce", list(range(cluster.num_gpus)), ALL_REDUCE_SIZE
    ).choice
    # PCIe-only nodes (no NVSwitch): of the order of one GPU's PCIe rate instead
    link = cluster.spec.nvswitch or cluster.spec.pcie
    assert 0.5 * link.bandwidth <= choice.busbw <= 2 * link.bandwidth


@pytest.mark.parametrize("preset", sorted(DATASHEET))
def test_new_presets_reduce_in_the_switch(preset):
    cluster = _cluster(preset, 1)
    choice = plan_collective(
        cluster, "all_reduce", list(range(cluster.num_gpus)), ALL_REDUCE_SIZE
    ).choice
    assert choice.algorithm == "nvls"


@pytest.mark.parametrize("preset", preset_names())
def test_two_node_all_reduce_is_bounded_by_the_nodes_nics(preset):
    """Across two nodes each of NCCL's rings and trees leaves the node through a NIC, so
    the bus bandwidth cannot beat the node's NICs together (5% slack for rounding)."""
    cluster = _cluster(preset, 2)
    choice = plan_collective(
        cluster, "all_reduce", list(range(cluster.num_gpus)), ALL_REDUCE_SIZE
    ).choice
    nic = cluster.spec.nic
    assert choice.busbw <= nic.per_node * nic.bandwidth * 1.05
