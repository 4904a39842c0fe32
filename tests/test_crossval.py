"""Cross-validation of the global parameters and the trust interval, on synthetic
suites whose answers are known."""

from __future__ import annotations

import json
import math
import random

import pytest

from benchmarks.crossval import (
    Fold,
    Parameter,
    cross_validate,
    fit,
    interpolate,
    interval_coverage,
    time_residual,
)
from benchmarks.validate import _causal_model_flops_share
from simulator.analysis.trust import (
    FEWEST_COMPARABLE,
    RESIDUALS_FILE,
    Descriptor,
    difference_within,
    gpu_generation,
    interval,
)
from simulator.arithmetic.counts import attention_core_flops_per_step, model_flops_per_step
from simulator.request.scenario import load_scenario

from .conftest import SCENARIOS

GRID = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
PARAMETER = Parameter("gemm", "matmul_efficiency", GRID)


def _case(case_id: str, source: str, gpu: str, work: float, truth: float) -> dict:
    """A compute-bound case: predicted time = work / efficiency multiplier; published
    time = the prediction at the true multiplier ``truth``."""
    return {
        "case": {"id": case_id, "source": source, "gpu": gpu, "scenario": {}},
        "grid": [work / g for g in GRID],
        "published": work / truth,
    }


def test_interpolation_is_exact_for_power_laws_and_extrapolates():
    values = [3.0 / g**1.5 for g in GRID]
    for x in (0.65, 0.93, 1.2, 1.3, 0.55):
        assert interpolate(GRID, values, x) == pytest.approx(3.0 / x**1.5)


def test_fit_recovers_the_true_multiplier():
    rows = [
        (_case(f"c{i}", "s", "A100", 1.0 + i, 0.83)["grid"], (1.0 + i) / 0.83) for i in range(5)
    ]
    assert fit(rows, GRID) == pytest.approx(0.83, rel=2e-3)
    assert fit([], GRID) is None


def test_leave_one_source_out_on_a_synthetic_suite():
    # three sources on one GPU agree on 0.8; a fourth says 1.0. In-sample, one value
    # serves all; left out, the odd source is predicted with the others' 0.8 and is
    # off by 0.8/1.0, while each agreeing source is predicted from a fit that the odd
    # source pulls only a little
    rows = [
        _case(f"{source}-{i}", source, "H100", 1.0 + i, truth)
        for source, truth in (("a", 0.8), ("b", 0.8), ("c", 0.8), ("odd", 1.0))
        for i in range(3)
    ]
    in_values, in_errors, folds = cross_validate(rows, PARAMETER, "global")
    assert in_values["all"] == pytest.approx(0.8, rel=5e-3)  # the median-like |log| fit
    odd = next(f for f in folds if f.source == "odd")
    assert odd.values["all"] == pytest.approx(0.8, rel=5e-3)
    # predicted time work/0.8 against published work/1.0: 25% too slow
    assert all(e == pytest.approx(0.25, rel=2e-2) for e in odd.errors.values())
    for fold in folds:
        if fold.source != "odd":
            assert all(abs(e) < 0.01 for e in fold.errors.values())
    assert set(in_errors) == {r["case"]["id"] for r in rows}


def test_per_gpu_scheme_leaves_a_lone_gpu_at_the_preset_value():
    rows = [_case("h-1", "a", "H100", 2.0, 0.7), _case("b-1", "b", "B200", 2.0, 0.9)]
    _, _, folds = cross_validate(rows, PARAMETER, "per-gpu")
    lone = next(f for f in folds if f.source == "b")
    assert lone.values.get("B200") is None  # nothing left to fit the B200 on
    # predicted at multiplier 1: 2.0 against 2.0/0.9 published
    assert lone.errors["b-1"] == pytest.approx(0.9 - 1.0, rel=1e-6)
    # the global scheme carries the H100's fit over to it
    _, _, folds = cross_validate(rows, PARAMETER, "global")
    lone = next(f for f in folds if f.source == "b")
    assert lone.values["all"] == pytest.approx(0.7, rel=5e-3)


def test_time_residuals_flip_for_rates():
    # a step time predicted 10% long: the truth is 1/1.1 of it
    assert time_residual(0.1, time_like=True) == pytest.approx(-math.log(1.1))
    # a throughput predicted 10% high: the true step is 1.1x the predicted one
    assert time_residual(0.1, time_like=False) == pytest.approx(math.log(1.1))


def _descriptor(**changes) -> dict:
    base = Descriptor("megatron", "hopper", False, "compute", 64, 4096).to_json()
    base["time_like"] = True
    return {**base, **changes}


def test_the_interval_holds_the_quantiles_of_comparable_residuals():
    # three sources offset by -0.1, 0 and +0.1, each with runs at -0.05, 0, +0.05 about
    # its own mean: a new source's run is any offset plus any deviation, the nine
    # values -0.15 ... +0.15 weighing the same
    residuals = [
        (_descriptor(source=f"s{offset}"), offset / 10 + deviation / 100)
        for offset in (-1, 0, 1)
        for deviation in (-5, 0, 5)
    ]
    trust = interval(_descriptor(), residuals)
    # the 10% quantile lies between the first two of the nine, at midpoints 1/18 and
    # 3/18: -0.15 + 0.05 * (0.1 - 1/18) / (2/18) = -0.13; the median is 0
    widen = math.sqrt(1 + 1 / 3)
    assert math.log(trust.low) == pytest.approx(-0.13 * widen)
    assert math.log(trust.high) == pytest.approx(0.13 * widen)
    assert trust.outside is None and trust.comparable == len(residuals)
    # another framework's runs are not comparable: the interval says so and widens
    other = interval(_descriptor(framework="deepspeed"), residuals)
    assert other.outside and "deepspeed" in other.outside
    assert math.log(other.high) == pytest.approx(2 * math.log(trust.high))


def test_each_source_weighs_the_same_and_their_spread_widens_the_interval():
    # one source of many alike runs and two of one run each: the many do not outvote
    # the two, and the sources' disagreement is what the interval spans
    crowd = [(_descriptor(source="crowd"), 0.0)] * 16
    residuals = [*crowd, (_descriptor(source="a"), 0.3), (_descriptor(source="b"), -0.3)]
    trust = interval(_descriptor(), residuals)
    assert math.log(trust.high) > 0.2 and math.log(trust.low) < -0.2
    # the same runs all from one source: no spread between sources to see, so a wider
    # group is needed; alone, every validated run is used
    same = [(_descriptor(source="one"), r) for _, r in residuals]
    assert interval(_descriptor(), same).basis.startswith("every validated run")


def test_the_most_specific_group_with_enough_cases_is_used():
    alike = [(_descriptor(source=f"s{i % 3}"), 0.3) for i in range(FEWEST_COMPARABLE)]
    unlike = [(_descriptor(dominant="bubble", source=f"t{i % 4}"), -0.3) for i in range(40)]
    trust = interval(_descriptor(), alike + unlike)
    assert trust.low == pytest.approx(math.exp(0.3)) and trust.comparable == FEWEST_COMPARABLE
    # too few alike: the wider group, every residual of the framework and GPU
    trust = interval(_descriptor(), alike[:-1] + unlike)
    assert trust.comparable == FEWEST_COMPARABLE - 1 + 40


def test_coverage_counts_the_left_out_cases_inside_their_intervals():
    # residuals spread evenly: an 80% interval made from the others holds about 80%
    rng = random.Random(0)
    folds, descriptors = [], {}
    for source in range(10):
        errors = {}
        for i in range(10):
            case = f"s{source}-{i}"
            errors[case] = math.exp(rng.gauss(0.0, 0.1)) - 1.0
            descriptors[case] = _descriptor()
        folds.append(Fold(f"s{source}", {}, errors))
    result = interval_coverage(folds, descriptors, lambda d, r: _bounds(interval(d, r)))
    assert result["cases"] == 100
    assert 0.7 <= result["coverage"] <= 0.9
    # an interval of nothing holds nothing; one of everything holds everything
    none = interval_coverage(folds, descriptors, lambda d, r: (1.0, 1.0))
    assert none["coverage"] == 0.0
    every = interval_coverage(folds, descriptors, lambda d, r: (0.01, 100.0))
    assert every["coverage"] == 1.0
    assert every["per_source"]["s3"] == {"inside": 10, "cases": 10}


def _bounds(trust):
    return trust.low, trust.high


def test_a_left_out_source_never_informs_its_own_interval():
    seen = []

    def spy(descriptor, residuals):
        seen.append(len(residuals))
        return (0.5, 2.0)

    folds = [Fold("a", {}, {"a1": 0.1, "a2": 0.2}), Fold("b", {}, {"b1": -0.1})]
    descriptors = {c: _descriptor() for c in ("a1", "a2", "b1")}
    interval_coverage(folds, descriptors, spy)
    assert seen == [1, 1, 2]


def test_gpu_generations_and_differences_within_intervals():
    assert gpu_generation("H100-SXM5-80GB") == "hopper"
    assert gpu_generation("A100-SXM4-80GB") == "ampere"
    assert gpu_generation("B200-SXM-180GB") == "blackwell"
    assert gpu_generation("GB200") == "blackwell"
    assert gpu_generation("MI300X") == "other"
    wide = {"low": 0.9, "high": 1.15}
    assert difference_within(10.0, wide, 10.5, wide)
    assert not difference_within(10.0, wide, 13.0, wide)
    assert difference_within(10.0, None, 10.5, wide) is None


def test_the_shipped_residuals_are_the_suites_cases():
    from pathlib import Path

    import yaml

    from simulator.analysis.trust import load_residuals

    residuals = load_residuals()
    assert len(residuals) >= FEWEST_COMPARABLE
    data = json.loads(RESIDUALS_FILE.read_text())
    cases = Path(__file__).parents[1] / "benchmarks" / "validation" / "cases"
    ids = {yaml.safe_load(path.read_text())["id"] for path in cases.glob("*.yaml")}
    for row in data["cases"]:
        assert row["id"] in ids
        assert set(row["descriptor"]) >= {"framework", "generation", "moe", "dominant"}
        assert math.isfinite(row["residual"])


def test_a_source_counting_causal_attention_at_half_is_compared_in_its_own_count():
    """Megatron-LM's FLOP count since late 2025 halves the attention core's scores for the
    causal mask: parasim's model FLOPs, which count them whole, are scaled to that count
    for such a case (``attention_flops: causal``), by the core's share."""
    scenario = load_scenario(SCENARIOS / "small.yaml")
    model = scenario.model
    s, width = model.seq_len, model.heads * model.head_dim
    # QK^T and the product with V, 2·s²·width FLOPs each forward, twice that backward
    assert attention_core_flops_per_step(model, 3, "flash") == 3 * model.layers * 12 * s * s * width
    share = attention_core_flops_per_step(model, 1, "flash") / model_flops_per_step(model, 1)
    assert 0 < share < 1
    assert _causal_model_flops_share(scenario) == pytest.approx(1 - share / 2)
