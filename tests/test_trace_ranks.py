"""Which ranks a run's trace files show: a deep pipeline's large trace keeps the ranks
of ``MAX_TRACE_STAGES`` evenly spaced stages (first, last and the critical rank's
among them) and says so; ``--full-trace`` keeps every simulated rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.report.outputs import write_run_outputs
from simulator.request.scenario import load_scenario
from simulator.run import simulate
from simulator.run.simulate import make_trace, run_scenario, trace_ranks

SMALL = Path(__file__).resolve().parent.parent / "scenarios" / "small.yaml"


@pytest.fixture(scope="module")
def deep_run():
    """GPT-2 small on 24 GPUs, tp 4 x pp 6, folded to one rank per stage."""
    overrides = [
        "cluster.nodes=3",
        "parallel.tp=4",
        "parallel.pp=6",
        "parallel.dp=1",
        "training.global_batch=64",
        "training.micro_batch=1",
        "simulation.fidelity=analytic",
    ]
    return run_scenario(load_scenario(SMALL, overrides))


def _stages(run, ranks) -> list[int]:
    return sorted({run.scenario.layout.coords(rank)["pp"] for rank in ranks})


def test_a_large_trace_of_a_deep_pipeline_keeps_evenly_spaced_stages(deep_run, monkeypatch):
    monkeypatch.setattr(simulate, "MAX_TRACE_STAGES", 3)
    monkeypatch.setattr(simulate, "STAGE_CAP_OPS", 10)
    ranks, note = trace_ranks(deep_run)
    critical = deep_run.result.breakdown.critical_rank
    stages = _stages(deep_run, ranks)
    assert {0, 5} <= set(stages)  # the first and the last
    assert deep_run.scenario.layout.coords(critical)["pp"] in stages
    assert set(stages) - {0, 5, deep_run.scenario.layout.coords(critical)["pp"]} <= {2, 3}
    assert 3 <= len(stages) <= 4
    assert f"of {len(stages)} of the 6 pipeline stages" in note and "--full-trace" in note
    trace = make_trace(deep_run, ranks)
    assert {rec.rank for rec in trace.records} == set(ranks)
    assert trace_ranks(deep_run, full=True) == (None, None)


def test_a_trace_under_the_op_limit_or_a_short_pipeline_keeps_every_rank(deep_run, monkeypatch):
    monkeypatch.setattr(simulate, "MAX_TRACE_STAGES", 3)
    ops = len(make_trace(deep_run).records)
    monkeypatch.setattr(simulate, "STAGE_CAP_OPS", ops)  # exactly at the limit: kept
    assert trace_ranks(deep_run) == (None, None)
    monkeypatch.setattr(simulate, "STAGE_CAP_OPS", ops - 1)
    assert trace_ranks(deep_run)[0] is not None
    monkeypatch.setattr(simulate, "MAX_TRACE_STAGES", 6)  # as many stages as the pipeline
    assert trace_ranks(deep_run) == (None, None)


def test_the_files_show_the_kept_stages_and_full_trace_every_rank(deep_run, monkeypatch, tmp_path):
    monkeypatch.setattr(simulate, "MAX_TRACE_STAGES", 3)
    monkeypatch.setattr(simulate, "STAGE_CAP_OPS", 10)
    kept, note = trace_ranks(deep_run)
    outputs = ("result", "trace")
    write_run_outputs(deep_run, tmp_path / "capped", title="t", outputs=outputs)
    capped = json.loads((tmp_path / "capped" / "trace.json").read_text())
    assert capped["otherData"]["ranks_in_file"] == kept
    result = json.loads((tmp_path / "capped" / "result.json").read_text())
    assert note in result["warnings"]

    deep_run.result.warnings.remove(note)
    write_run_outputs(deep_run, tmp_path / "full", title="t", outputs=outputs, full_trace=True)
    full = json.loads((tmp_path / "full" / "trace.json").read_text())
    assert full["otherData"]["ranks_in_file"] == sorted(deep_run.schedule.programs)
    assert len(full["otherData"]["ranks_in_file"]) == 6
    result = json.loads((tmp_path / "full" / "result.json").read_text())
    assert not any("pipeline stages" in warning for warning in result["warnings"])
