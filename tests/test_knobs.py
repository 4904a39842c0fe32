"""Each knob is declared once (:mod:`simulator.request.knobs`): the recipe, the scenario
schema, the sweep's candidates, pins and CSV columns agree with the table, and no other
module writes a list of knob names by hand."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from simulator.common.vocabulary import GROUP_AXES
from simulator.report.scale_report import CSV_FIELDS as SCALE_CSV
from simulator.report.sweep_report import CSV_FIELDS, KNOB_COLUMNS
from simulator.request.knobs import KNOB, KNOBS, LAYOUT_KNOBS, SEARCHED, SWEEP_FIX_KEYS
from simulator.request.layout import Layout
from simulator.request.recipe import Recipe
from simulator.request.scenario import ParallelSpec, TrainingSpec, load_scenario
from simulator.tools.space import Candidate, check_fixed

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
OWNERS = {"layout": Layout, "recipe": Recipe}
SECTIONS = {"parallel": ParallelSpec, "training": TrainingSpec}
# schema defaults that mean "derived": dp from the world, no HSDP, sharding from the older
# optimizer_sharding spelling, an even stage split
DERIVED_IN_SCHEMA = {"dp", "dp_shard", "sharding", "stage_layers"}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_a_knob_is_its_dataclass_field_and_its_schema_field(knob):
    owner = {f.name: f for f in dataclasses.fields(OWNERS[knob.owner])}
    assert knob.name in owner, f"{knob.owner} has no field {knob.name}"
    field = owner[knob.name]
    if field.default is not dataclasses.MISSING:
        assert field.default == knob.default
    section, _, name = knob.path.partition(".")
    schema = SECTIONS[section].model_fields
    assert name in schema, f"the scenario has no {knob.path}"
    if knob.name not in DERIVED_IN_SCHEMA:
        default = schema[name].default
        assert (tuple(default) if isinstance(default, list) else default) == knob.default
    literal = [a for a in typing.get_args(schema[name].annotation) if a is not type(None)]
    if knob.choices and literal and typing.get_origin(schema[name].annotation) is typing.Literal:
        assert set(typing.get_args(schema[name].annotation)) == set(knob.choices)


def test_the_sweep_and_its_reports_are_derived_from_the_table():
    names = [knob.name for knob in SEARCHED]
    assert list(SWEEP_FIX_KEYS) == names
    assert [f.name for f in dataclasses.fields(Candidate)] == names
    assert set(LAYOUT_KNOBS) <= set(names)
    assert [k for k in CSV_FIELDS if k in KNOB] == names
    assert [k for k in SCALE_CSV if k in KNOB] == names
    assert [key for _, key in KNOB_COLUMNS if key in KNOB] == names
    assert KNOB["dp_shard"].heading == "HSDP shard"  # a heading the table sets


def test_a_recipe_round_trips_through_its_text_and_its_candidate():
    for path in sorted(SCENARIOS.glob("*.yaml"))[:40]:
        recipe = load_scenario(path).recipe
        assert str(Recipe.parse(str(recipe))) == str(recipe)
        candidate = Candidate.of_recipe(recipe)
        assert candidate.label().startswith(recipe.label())
        assert Candidate.from_knobs(candidate.fields()) == candidate


def test_a_pin_is_checked_as_its_knob_says():
    assert check_fixed({"mb": 2, "v": 2, "rc": "full", "placement": "tp,pp,dp"}) == {
        "micro_batch": 2,
        "virtual_stages": 2,
        "recompute": "full",
        "placement": ("tp", "pp", "dp"),
    }
    assert check_fixed({"reshard_after_forward": "off"}) == {"reshard_after_forward": False}
    for pin, message in (
        ({"schedule": "custom"}, r"--fix schedule='custom': expected one of gpipe, 1f1b, .*zbv"),
        ({"dp_shard": -1}, "--fix dp_shard=-1: expected a whole number >= 0"),
        ({"tp": 0}, "--fix tp=0: expected a positive integer"),
        ({"placement": "tp,tp,pp"}, "must order each of tp, dp, pp exactly once"),
        ({"sharding": "ful"}, r"one of none, optimizer, gradients, full \(did you mean 'full'\?\)"),
    ):
        with pytest.raises(Exception, match=message):
            check_fixed(pin)


# Knob names that are also the names of process-group axes: a tuple of them is an axis
# order (a placement), not a list of knobs.
AXES = set(GROUP_AXES)
# Where a literal names several knobs for a reason of its own.
EXCEPTIONS = {
    # the enumerator lays out the knobs whose choices depend on one another
    "simulator/tools/space.py",
    # the trace's metadata block, a documented output format
    "simulator/schedule/step.py",
}


def _hand_lists(path: Path) -> list[tuple[int, list[str]]]:
    names = set(KNOB)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        else:
            continue
        spelled = {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
        if len(spelled) >= 3 and spelled - AXES:
            found.append((node.lineno, sorted(spelled)))
    return found


def test_no_module_spells_a_list_of_knobs_by_hand():
    offenders = []
    for path in sorted((ROOT / "simulator").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "simulator/request/knobs.py" or relative in EXCEPTIONS:
            continue
        offenders += [f"{relative}:{line} {names}" for line, names in _hand_lists(path)]
    assert not offenders, "knob names listed by hand (derive them from KNOBS):\n" + "\n".join(
        offenders
    )


def test_the_scan_finds_a_hand_written_list(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('COLUMNS = ("tp", "micro_batch", "recompute")\nORDER = ("tp", "dp", "pp")\n')
    assert _hand_lists(sample) == [(1, ["micro_batch", "recompute", "tp"])]
