"""Each closed set of names is defined once, in ``simulator.common.vocabulary``, and the
scenario schema, the command line, the builder's tags, the NCCL tables and the reports'
colours all take theirs from it."""

from __future__ import annotations

import typing

import pytest

from simulator.analysis.metrics import CATEGORIES
from simulator.cli.main import _parser
from simulator.common import vocabulary as v
from simulator.engine import nccl
from simulator.report.style import AXIS_COLORS, BREAKDOWN_COLORS
from simulator.request.model import ModelSpec
from simulator.request.scenario import ParallelSpec, SimulationSpec, TrainingSpec, load_scenario
from simulator.run.simulate import per_rank_schedule
from simulator.schedule.ir import Block, Collective

from .conftest import SCENARIOS


def _choices(model: type, field: str) -> set[str]:
    """The names a pydantic field accepts (``Literal``, optionally in a list or None)."""
    annotation = model.model_fields[field].annotation
    names: set[str] = set()
    stack = [annotation]
    while stack:
        tp = stack.pop()
        if typing.get_origin(tp) is typing.Literal:
            names |= set(typing.get_args(tp))
        else:
            stack += list(typing.get_args(tp))
    return names


@pytest.mark.parametrize(
    "model, field, names",
    [
        (ParallelSpec, "schedule", v.SCHEDULES),
        (ParallelSpec, "placement", v.GRID_AXES),
        (ParallelSpec, "cp_kind", v.CP_KINDS),
        (TrainingSpec, "sharding", v.SHARDING_LEVELS),
        (TrainingSpec, "recompute", v.RECOMPUTE_MODES),
        (TrainingSpec, "attention", v.ATTENTION_KERNELS),
        (TrainingSpec, "tp_comm_overlap", v.TP_COMM_OVERLAP),
        (TrainingSpec, "grad_reduce_dtype", v.GRADIENT_DTYPES),
        (TrainingSpec, "dtype", v.TRAINING_DTYPES),
        (SimulationSpec, "fidelity", v.FIDELITIES),
        (SimulationSpec, "algorithm", v.ALGORITHMS),
        (SimulationSpec, "protocol", v.PROTOCOLS),
        (ModelSpec, "mlp", v.MLP_KINDS),
        (ModelSpec, "norm", v.NORM_KINDS),
        (ModelSpec, "position", v.POSITION_KINDS),
    ],
)
def test_the_scenario_schema_takes_its_names_from_the_vocabulary(model, field, names):
    assert _choices(model, field) == set(names)


def _subcommand(name: str):
    parser = _parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    return commands.choices[name]


def test_the_command_line_takes_its_choices_from_the_vocabulary():
    collbench = {a.dest: a.choices for a in _subcommand("collbench")._actions}
    assert list(collbench["algo"]) == list(v.ALGORITHMS)
    assert list(collbench["proto"]) == list(v.PROTOCOLS)
    assert list(collbench["fidelity"]) == list(v.FIDELITIES)
    assert set(collbench["op"]) == (set(v.COLLECTIVE_KINDS) - {"barrier"}) | {"sendrecv"}
    for command in ("sweep", "scale", "explain"):
        fidelity = {a.dest: a.choices for a in _subcommand(command)._actions}["fidelity"]
        assert list(fidelity) == list(v.FIDELITIES)


def test_nccl_tables_cover_every_algorithm_and_protocol():
    assert nccl.ALGORITHMS is v.ALGORITHMS and nccl.PROTOCOLS is v.PROTOCOLS


def test_report_colours_cover_every_category_and_axis():
    assert set(BREAKDOWN_COLORS) == set(CATEGORIES)
    assert set(AXIS_COLORS) == set(v.COMM_AXES)


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("pipeline-demo.yaml", ["parallel.schedule=zb-h1", "training.recompute=full"]),
        ("mixtral-ep.yaml", ["model.layers=2", "training.global_batch=16"]),
        ("dense-70b-sp.yaml", ["training.global_batch=8", "training.optimizer_sharding=true"]),
    ],
)
def test_the_builder_tags_ops_with_vocabulary_names(name, overrides):
    schedule = per_rank_schedule(load_scenario(SCENARIOS / name, overrides))
    phases, axes, kinds = set(), set(), set()
    for program in schedule.programs.values():
        for op in program.ops:
            for inner in op.body if type(op) is Block else (op,):
                phases.add(inner.tags.get("phase"))
                axes.add(inner.tags.get("axis"))
                if type(inner) is Collective:
                    kinds.add(inner.kind)
    assert phases - {None} <= set(v.PHASES)
    assert axes - {None} <= set(v.COMM_AXES)
    assert kinds <= set(v.COLLECTIVE_KINDS)
