"""Calibration profiles: applied to a cluster, and refused when wrong (no torch needed)."""

from __future__ import annotations

import copy
import json

import pytest

from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from topologies import TopologyError, load_cluster_spec

from .conftest import SCENARIOS
from .helpers import sustained_peak

VALID = {
    "format": "parasim-calibration",
    "version": 1,
    "created": "2026-11-29T10:00:00+00:00",
    "device": {"name": "cpu", "type": "cpu", "count": 2, "per_node": 2, "nodes": 1},
    "software": {"torch": "2.13.0", "backend": "gloo", "backend_version": "gloo"},
    "gpu": {
        "peak_flops": 1.92e11,
        "matmul_efficiency": 0.5,
        "attention_efficiency": 0.5,
        "kernel_launch_overhead": 1e-5,
        "hbm_bandwidth": 1e10,
    },
    "comm": {
        "all_reduce": {
            "intra_node": {"alpha": 1e-4, "bandwidth": 1e9, "rms_residual_s": 1e-6, "points": 5}
        },
        "p2p": {
            "intra_node": {"alpha": 5e-5, "bandwidth": 2e9, "rms_residual_s": 1e-6, "points": 5}
        },
    },
}


def write(tmp_path, payload, name="profile.json"):
    path = tmp_path / name
    path.write_text(json.dumps(payload) if not isinstance(payload, str) else payload)
    return path


def cluster_with(path):
    return load_cluster_spec({"preset": "cpu-localhost", "nodes": 1, "profile": str(path)})


def test_profile_values_replace_the_presets_and_overrides_still_win(tmp_path):
    path = write(tmp_path, VALID)
    spec = cluster_with(path)
    assert spec.gpu.matmul_efficiency == 0.5 and spec.gpu.hbm_bandwidth == 1e10
    assert spec.calibration.comm["all_reduce"].intra_node.bandwidth == 1e9
    assert spec.calibration.comm["all_reduce"].inter_node is None
    explicit = load_cluster_spec(
        {
            "preset": "cpu-localhost",
            "nodes": 1,
            "profile": str(path),
            "gpu": {"matmul_efficiency": 0.7},
        }
    )
    assert explicit.gpu.matmul_efficiency == 0.7


def test_a_calibrated_all_reduce_alone_takes_the_fitted_time(tmp_path):
    from simulator.engine.core import simulate
    from simulator.schedule.ir import Collective, Program, Schedule
    from topologies import build_cluster

    cluster = build_cluster(cluster_with(write(tmp_path, VALID)))
    size = 4e6
    programs = {r: Program(r, [Collective(0, "c", "all_reduce", "g", size)]) for r in (0, 1)}
    elapsed = simulate(Schedule(programs, {"g": (0, 1)}), cluster).step_time
    # n = 2: 2(n-1) = 2 steps of alpha, factor 2(n-1)/n = 1
    assert elapsed == pytest.approx(2 * 1e-4 + size / 1e9, rel=1e-9)


def test_scenario_names_a_profile(tmp_path):
    path = write(tmp_path, VALID)
    base = run_scenario(load_scenario(SCENARIOS / "cpu-tiny.yaml"))
    calibrated = run_scenario(
        load_scenario(SCENARIOS / "cpu-tiny.yaml", [f"cluster.profile={path}"])
    )
    assert calibrated.result.step_time_s > base.result.step_time_s  # slower GPU in the profile


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda p: p.update(version=2), "has profile version 2; this parasim reads version 1"),
        (lambda p: p.update(format="something"), "is not a parasim calibration profile"),
        (lambda p: p["gpu"].update(jitter=0.9), "gpu.jitter"),
        (lambda p: p["gpu"].update(op_table=[{"kind": "gemm", "seconds": 0}]), "op_table"),
        (lambda p: p["gpu"].pop("hbm_bandwidth"), "gpu.hbm_bandwidth: required field is missing"),
        (lambda p: p.pop("device"), "device: required field is missing"),
        (lambda p: p["gpu"].update(matmul_efficiency=1.5), "gpu.matmul_efficiency"),
        (lambda p: p["comm"]["p2p"]["intra_node"].update(bandwidth=0), "bandwidth"),
    ],
)
def test_bad_profiles_are_refused_with_one_line(tmp_path, mutate, message):
    payload = copy.deepcopy(VALID)
    mutate(payload)
    with pytest.raises(TopologyError) as info:
        cluster_with(write(tmp_path, payload))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unreadable_profiles(tmp_path):
    with pytest.raises(TopologyError, match="is not JSON"):
        cluster_with(write(tmp_path, "{not json"))
    with pytest.raises(TopologyError, match="cannot read"):
        cluster_with(tmp_path / "missing.json")


def test_bad_profile_through_the_command_line(tmp_path, capsys):
    from simulator.cli.main import main

    payload = copy.deepcopy(VALID)
    payload["version"] = 0
    path = write(tmp_path, payload)
    assert main(["run", str(SCENARIOS / "cpu-tiny.yaml"), "--set", f"cluster.profile={path}"]) == 2
    assert "cluster.profile: " in capsys.readouterr().err


def test_a_measured_gemm_table_times_its_shapes(tmp_path):
    """A profile's measured GEMMs replace the shape model: a measured shape runs at its
    measured efficiency, on a GPU preset with a shape model or on one without."""
    from simulator.engine.compute import ComputeModel
    from simulator.schedule.ir import Compute

    payload = copy.deepcopy(VALID)
    payload["gpu"]["gemm_table"] = [[256, 256, 256, 0.25], [512, 512, 512, 0.4]]
    spec = cluster_with(write(tmp_path, payload))
    model = ComputeModel(spec)
    for n, efficiency in ((256, 0.25), (512, 0.4)):
        flops = 2.0 * n**3
        op = Compute(0, "compute", flops, 0.0, "gemm", shape=(n, n, n))
        seconds = model.duration(op) - spec.gpu.kernel_launch_overhead
        # a measured efficiency is a microbenchmark's: training sustains its share of it
        assert seconds == pytest.approx(flops / (sustained_peak(spec) * efficiency))
    plain = ComputeModel(cluster_with(write(tmp_path, VALID, "plain.json")))
    op = Compute(0, "compute", 2.0 * 512**3, 0.0, "gemm", shape=(512, 512, 512))
    assert plain.duration(op) < model.duration(op)  # 0.5 flat against 0.4 measured


def test_a_profile_bandwidth_is_what_kernels_reach(tmp_path):
    """A profile's measured copy bandwidth is not derated again by the preset's
    hbm_efficiency."""
    from simulator.engine.compute import ComputeModel

    payload = copy.deepcopy(VALID)
    payload["device"]["per_node"] = 8
    path = write(tmp_path, payload)
    spec = load_cluster_spec({"preset": "dgx-h100", "nodes": 1, "profile": str(path)})
    assert spec.gpu.hbm_bandwidth == 1e10 and spec.gpu.hbm_efficiency == 1.0
    assert ComputeModel(spec).stream_bandwidth == 1e10


def test_a_one_gpu_profile_applies_to_nodes_of_eight_with_a_note(tmp_path):
    """A profile measured on one GPU (no communication measured) applies its device to
    an 8-GPU node; the links keep the preset's figures, and the result says so."""
    one = copy.deepcopy(VALID)
    one["device"].update(count=1, per_node=1)
    one["comm"] = {}
    one["gpu"].update(peak_flops=989.4e12, hbm_bandwidth=4.0e12, matmul_efficiency=0.6)
    path = write(tmp_path, one)
    scenario = load_scenario(SCENARIOS / "llama3-8b.yaml", [f"cluster.profile={path}"])
    spec = scenario.cluster_spec
    assert spec.gpus_per_node == 8 and spec.gpu.matmul_efficiency == 0.6
    assert spec.calibration.comm == {}
    note = next(w for w in scenario.warnings if "was measured with 1 device per node" in w)
    assert "the cluster has 8" in note and "keep the preset's figures" in note
    result = run_scenario(scenario).result
    assert note in result.warnings
    # the same profile measured on 2 devices keeps its fits, and says that too
    two = copy.deepcopy(VALID)
    spec = load_cluster_spec(
        {"preset": "dgx-h100", "nodes": 1, "profile": str(write(tmp_path, two, "two.json"))}
    )
    assert spec.calibration.comm["all_reduce"].intra_node.bandwidth == 1e9
    assert "its 2-device communication fits stand for these nodes' links" in spec.calibration.note


def test_measured_ops_take_their_measured_time(tmp_path):
    """An op_table row replaces the model's time for the op it matches, and only that op."""
    from simulator.engine.compute import ComputeModel

    base = run_scenario(load_scenario(SCENARIOS / "cpu-tiny.yaml"))
    ops = [
        op
        for op in base.schedule.programs[0].ops
        if op.type == "compute" and op.kind == "gemm" and op.shape is not None
    ]
    target = ops[0]
    row = {
        "kind": target.kind,
        "flops": target.flops,
        "bytes": target.bytes,
        "shape": list(target.shape),
        "batch": target.batch,
        "fp8": target.fp8,
        "seconds": 0.0123,
    }
    profile = copy.deepcopy(VALID)
    profile["gpu"]["op_table"] = [row]
    spec = cluster_with(write(tmp_path, profile))
    model = ComputeModel(spec)
    assert model.duration(target) == 0.0123
    other = next(op for op in ops if op.shape != target.shape)
    assert model.duration(other) != 0.0123 and model.measured_ops == 1


def test_cpu_ranks_beyond_the_machine_s_cores_share_them(tmp_path):
    """A CPU profile measured with 2 ranks on 2 cores, applied to 4 ranks on that
    machine: two ranks share a core, and the result says so."""
    profile = copy.deepcopy(VALID)
    profile["device"]["cores"] = 2
    path = write(tmp_path, profile)
    two = cluster_with(path)
    four = load_cluster_spec(
        {"preset": "cpu-localhost", "nodes": 1, "gpus_per_node": 4, "profile": str(path)}
    )
    assert two.gpu.devices_per_core == 1 and "share" not in two.calibration.note
    assert four.gpu.devices_per_core == 2
    assert four.gpu.matmul_efficiency == 0.5  # the device itself is as fast
    assert "4 CPU ranks share the 2 cores the profile measured" in four.calibration.note
    # a GPU profile never shares: its devices are its own
    gpu = copy.deepcopy(profile)
    gpu["device"]["type"] = "cuda"
    spec = load_cluster_spec(
        {
            "preset": "cpu-localhost",
            "nodes": 1,
            "gpus_per_node": 4,
            "profile": str(write(tmp_path, gpu, "g.json")),
        }
    )
    assert spec.gpu.devices_per_core == 1


@pytest.mark.parametrize("overrides", [[], ["simulation.fidelity=analytic"]])
def test_ranks_sharing_cores_slow_down_only_while_they_compute_together(tmp_path, overrides):
    """4 CPU ranks on 2 cores: data parallelism (all four compute at once) runs its
    compute about twice as slow as on a core each; a 4-stage pipeline of one
    micro-batch (one stage computes at a time) as fast."""
    profile = copy.deepcopy(VALID)
    profile["device"]["cores"] = 4
    own = write(tmp_path, profile, "own.json")
    profile["device"]["cores"] = 2
    shared = write(tmp_path, profile, "shared.json")
    base = ["cluster.gpus_per_node=4", "parallel.tp=1", *overrides]
    layouts = {
        "dp": ["parallel.dp=4", "training.global_batch=4", "training.micro_batch=1"],
        "pp": ["parallel.pp=4", "parallel.dp=1", "training.global_batch=2"],
    }
    slowdown = {}
    for name, layout in layouts.items():
        steps = []
        for path in (own, shared):
            scenario = load_scenario(
                SCENARIOS / "cpu-tiny.yaml", [*base, *layout, f"cluster.profile={path}"]
            )
            run = run_scenario(scenario)
            compute = sum(
                run.times.end[0][op.id] - run.times.start[0][op.id]
                for op in run.schedule.programs[0].ops
                if op.type == "compute"
            )
            steps.append(compute)
        slowdown[name] = steps[1] / steps[0]
    assert slowdown["dp"] == pytest.approx(2.0, rel=0.05)
    assert slowdown["pp"] == pytest.approx(1.0, rel=0.05)


def test_a_calibrated_uneven_all_to_all_takes_the_fit_at_its_busiest_member(tmp_path):
    """With a fitted all-to-all, an uneven one (MoE dispatch) is priced by that fit at
    the size of the even all-to-all whose members move what its busiest member moves,
    not by the send/recv fit."""
    from simulator.engine.collectives import collective_transfers, even_equivalent

    profile = copy.deepcopy(VALID)
    profile["comm"]["all_to_all"] = {
        "intra_node": {"alpha": 3e-4, "bandwidth": 4e8, "rms_residual_s": 1e-6, "points": 5}
    }
    from topologies import build_cluster

    cluster = build_cluster(cluster_with(write(tmp_path, profile)))
    splits = {0: (0.0, 3e6), 1: (1e6, 0.0)}  # rank 0 sends 3 MB, rank 1 sends 1 MB
    assert even_equivalent(splits, [0, 1]) == 6e6  # 3 MB out of 2 ranks: S·(n-1)/n = 3 MB
    choice, _ = collective_transfers(cluster, "all_to_all", [0, 1], 4e6, splits)
    even, _ = collective_transfers(cluster, "all_to_all", [0, 1], 6e6)
    assert choice == even and choice.protocol == "calibrated"
    # without an all-to-all fit it stays a flow per pair, on the send/recv plan
    plain = build_cluster(cluster_with(write(tmp_path, VALID, "plain.json")))
    pairwise, specs = collective_transfers(plain, "all_to_all", [0, 1], 4e6, splits)
    assert len(specs) == 2


def test_a_call_measured_in_its_own_step_takes_its_measured_time(tmp_path):
    """A profile's ``table`` (calls measured in a scenario's step): a call of the same
    members and size takes the measured time; other sizes keep the fit."""
    from simulator.engine.core import simulate
    from simulator.schedule.ir import Collective, Program, Schedule
    from topologies import build_cluster

    profile = copy.deepcopy(VALID)
    profile["comm"]["all_reduce"]["intra_node"]["table"] = [
        {"ranks": 2, "bytes": 4e6, "seconds": 0.05}
    ]
    cluster = build_cluster(cluster_with(write(tmp_path, profile)))

    def alone(size):
        programs = {r: Program(r, [Collective(0, "c", "all_reduce", "g", size)]) for r in (0, 1)}
        return simulate(Schedule(programs, {"g": (0, 1)}), cluster).step_time

    assert alone(4e6) == pytest.approx(0.05, rel=1e-9)
    assert alone(2e6) == pytest.approx(2 * 1e-4 + 2e6 / 1e9, rel=1e-9)


def test_a_call_measured_in_its_step_does_not_take_turns_with_compute(tmp_path):
    """On CPU ranks whose collectives share the compute core, a fitted collective waits
    for the core and holds it; one measured in its own step already holds that sharing
    in its time (and the compute's), so it overlaps the compute beside it."""
    from simulator.engine.core import simulate
    from simulator.schedule.ir import Collective, Compute, Program, Schedule
    from topologies import build_cluster

    def step(table):
        profile = copy.deepcopy(VALID)
        profile["device"]["cores"] = 2  # one core per rank: collectives share it
        profile["comm"]["all_reduce"]["intra_node"]["table"] = table
        cluster = build_cluster(cluster_with(write(tmp_path, profile)))
        assert cluster.spec.gpu.comm_on_compute_cores
        programs = {
            r: Program(
                r,
                [
                    Compute(0, "compute", 1e9, 0.0, "gemm"),
                    Collective(1, "comm", "all_reduce", "g", 4e6, deps=(0,)),
                    Compute(2, "compute", 1e10, 0.0, "gemm", deps=(0,)),
                ],
            )
            for r in (0, 1)
        }
        return simulate(Schedule(programs, {"g": (0, 1)}), cluster).step_time

    compute = (1e9 + 1e10) / (1.92e11 * 0.5) + 2 * 1e-5
    fitted = 2 * 1e-4 + 4e6 / 1e9
    assert step([]) == pytest.approx(compute + fitted, rel=1e-6)  # turns
    assert step([{"ranks": 2, "bytes": 4e6, "seconds": 0.004}]) == pytest.approx(
        compute, rel=1e-6
    )  # overlapped
