"""A GPU power limit below the TDP (``cluster.gpu.power_limit_w``): compute-bound time
grows by the sustained-clock ratio of topologies/clocks.py, and nothing else moves (HBM-
bound ops, collectives, memory); the default changes nothing; refused values give one
line and exit status 2."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from rich.console import Console

from simulator.analysis.result import StepResult
from simulator.cli.main import main
from simulator.engine.compute import ComputeModel
from simulator.engine.core import simulate
from simulator.report.summary import draw_summary, summarise
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.schedule.ir import Collective, Compute, Program, Schedule
from topologies import TopologyError, load_cluster_spec, preset_names
from topologies.units import parse_frequency, parse_power

from .conftest import SCENARIOS
from .helpers import cluster

SMALL = str(SCENARIOS / "small.yaml")
# A large square GEMM: compute-bound on every preset (its arithmetic intensity is ~2700
# FLOP/byte, far above any GPU's ridge point).
N = 8192
BIG_GEMM = Compute(0, "compute", 2.0 * N**3, 3 * 2.0 * N * N, "gemm", shape=(N, N, N))
# An elementwise op of a GiB: HBM-bound.
STREAM = Compute(0, "compute", 1e3, 2.0**30, "elementwise")


def _gpu(preset: str, **gpu):
    return load_cluster_spec({"preset": preset, "nodes": 1, "gpu": gpu})


def _expected_ratio(tdp: float, static: float, limit: float) -> float:
    """f(limit)/f(TDP) from P = P_static + k·f³, written out independently."""
    return ((limit - static) / (tdp - static)) ** (1 / 3)


@pytest.mark.parametrize("preset", [p for p in preset_names() if p != "cpu-localhost"])
def test_every_gpu_preset_gives_its_power_and_clocks(preset):
    gpu = _gpu(preset).gpu
    assert gpu.tdp_w is not None and gpu.static_power_w is not None
    assert 0 < gpu.static_power_w < gpu.tdp_w
    assert gpu.boost_clock_hz is not None
    if gpu.sustained_clock_hz is not None:  # under a GEMM at the TDP: below the boost clock
        assert gpu.sustained_clock_hz < gpu.boost_clock_hz
    if gpu.min_power_limit_w is not None:
        assert gpu.static_power_w < gpu.min_power_limit_w < gpu.tdp_w
    assert gpu.power_limit_w is None and gpu.compute_clock_factor == 1.0


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "dgx-b200"])
def test_the_default_and_a_limit_at_the_tdp_change_nothing(preset):
    default = ComputeModel(_gpu(preset))
    at_tdp = ComputeModel(_gpu(preset, power_limit_w=_gpu(preset).gpu.tdp_w))
    for model in (default, at_tdp):
        gpu = _gpu(preset).gpu
        assert model.peak == gpu.peak_flops * gpu.sustained_fraction
    assert default.duration(BIG_GEMM) == at_tdp.duration(BIG_GEMM)
    assert default.fp8_peak == at_tdp.fp8_peak


def test_a_limit_below_the_tdp_slows_compute_bound_ops_by_the_clock_ratio():
    spec = _gpu("dgx-h100", power_limit_w=500)
    ratio = _expected_ratio(700, 145, 500)
    assert spec.gpu.compute_clock_factor == pytest.approx(ratio)
    assert 0.8 < ratio < 0.9  # about 14% less clock at 500 of 700 W
    capped, default = ComputeModel(spec), ComputeModel(_gpu("dgx-h100"))
    launch = default.launch_overhead
    slower = (capped.duration(BIG_GEMM) - launch) / (default.duration(BIG_GEMM) - launch)
    assert slower == pytest.approx(1 / ratio)
    assert capped.fp8_peak == pytest.approx(default.fp8_peak * ratio)
    # HBM-bound: the memory clock does not follow the SM clock
    assert capped.duration(STREAM) == default.duration(STREAM)
    # a lower limit costs more clock
    lower = ComputeModel(_gpu("dgx-h100", power_limit_w=300))
    assert lower.duration(BIG_GEMM) > capped.duration(BIG_GEMM)


def test_a_collective_takes_the_same_time_under_a_power_limit():
    programs = {
        r: Program(r, [Collective(0, "comm", "all_reduce", "world", 2**30)]) for r in range(8)
    }
    schedule = Schedule(programs, {"world": tuple(range(8))})
    default = simulate(schedule, cluster("dgx-a100")).step_time
    capped = simulate(schedule, cluster("dgx-a100", gpu={"power_limit_w": 200})).step_time
    assert capped == default > 0


def test_a_capped_run_is_slower_with_a_lower_mfu_and_the_same_memory():
    default = run_scenario(load_scenario(SMALL)).result
    capped = run_scenario(load_scenario(SMALL, ["cluster.gpu.power_limit_w=250 W"])).result
    assert capped.step_time_s > default.step_time_s
    assert capped.mfu < default.mfu
    # MFU is still quoted against the datasheet peak
    assert capped.cluster.peak_flops_per_gpu == default.cluster.peak_flops_per_gpu
    assert capped.memory == default.memory
    assert capped.cluster.power_limit_w == 250 and default.cluster.power_limit_w is None


def test_the_default_run_is_unchanged_by_a_limit_at_the_tdp():
    default = run_scenario(load_scenario(SMALL)).result
    at_tdp = run_scenario(load_scenario(SMALL, ["cluster.gpu.power_limit_w=400"])).result
    assert at_tdp.step_time_s == default.step_time_s
    assert at_tdp.breakdown == default.breakdown


def test_a_scenario_sets_the_limit_and_the_result_shows_it(tmp_path):
    scenario = {
        "name": "capped",
        "cluster": {"preset": "dgx-h100", "nodes": 1, "gpu": {"power_limit_w": 500}},
        "model": {"preset": "gpt2-small"},
        "training": {"global_batch": 16, "micro_batch": 4},
        "parallel": {"tp": 2, "pp": 1, "dp": 4},
    }
    path = tmp_path / "capped.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = run_scenario(load_scenario(path)).result
    saved = StepResult.from_json(json.loads(json.dumps(result.to_json())))
    assert result.to_json()["cluster"]["power_limit_w"] == 500
    assert saved.cluster.power_limit_w == 500
    console = Console(file=io.StringIO(), width=200)
    draw_summary(summarise(result, []), console)
    assert "power limit 500 W" in console.file.getvalue()


@pytest.mark.parametrize(
    "value,expected",
    [
        ("800 W", "cluster.gpu.power_limit_w: 800 W is above the board's TDP (tdp_w 700 W)"),
        (
            "150 W",
            "cluster.gpu.power_limit_w: 150 W is below the board's minimum enforceable "
            "limit (min_power_limit_w 200 W); give 200 to 700 W",
        ),
        ("0.5", "give a unit, e.g. '700 W'"),
        ("fast", "cluster.gpu.power_limit_w"),
    ],
)
def test_refused_limits_exit_2_with_one_line(value, expected, capsys, tmp_path):
    code = main(
        [
            "run",
            SMALL,
            "--out",
            str(tmp_path),
            "--set",
            "cluster.preset=dgx-h100",
            "--set",
            f"cluster.gpu.power_limit_w={value}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert err.count("\n") == 1 and err.startswith("parasim: error: ")
    assert not any(tmp_path.iterdir())


def test_a_gpu_without_a_power_curve_refuses_a_limit():
    with pytest.raises(TopologyError, match=r"power_limit_w: 300 W needs the GPU's tdp_w"):
        _gpu("cpu-localhost", power_limit_w=300)
    with pytest.raises(TopologyError, match=r"not above the power the board draws"):
        _gpu("pcie-l40s", power_limit_w=60)
    with pytest.raises(TopologyError, match=r"static_power_w: 800 W must be below"):
        _gpu("dgx-h100", static_power_w=800)


def test_power_and_clock_fields_read_human_units():
    assert parse_power("700 W") == 700 and parse_power("1.2 kW") == 1200
    assert parse_frequency("1830 MHz") == 1.83e9 and parse_frequency("1.41 GHz") == 1.41e9
    gpu = _gpu("dgx-h100", power_limit_w="0.5 kW", sustained_clock_hz="1.6 GHz").gpu
    assert gpu.power_limit_w == 500 and gpu.sustained_clock_hz == 1.6e9
    with pytest.raises(TopologyError, match=r"give a unit, e.g. '1830 MHz'"):
        _gpu("dgx-h100", boost_clock_hz=1830)
    with pytest.raises(TopologyError, match=r"not a plausible power"):
        _gpu("dgx-h100", tdp_w="200 kW")
