"""The documentation names what the commands really have: every preset (clusters and
models), every command and each of its flags, and every field of the scenario format
appear in README.md or docs/*.md, so a user who reads the guide meets no hidden option
and no option that does not exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from simulator.cli.main import _parser
from simulator.request.model import MODEL_PRESETS
from topologies.build import preset_names

ROOT = Path(__file__).resolve().parent.parent
DOCS = "\n".join(
    path.read_text(encoding="utf-8")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _mentioned(name: str) -> bool:
    """``name`` appears as a whole word (not inside a longer name)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", DOCS) is not None


@pytest.mark.parametrize("preset", preset_names())
def test_every_cluster_preset_is_documented(preset):
    assert _mentioned(preset), f"cluster preset {preset} is not in README.md or docs/"


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_every_model_preset_is_documented(preset):
    assert _mentioned(preset), f"model preset {preset} is not in README.md or docs/"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_command_and_flag_is_documented(command):
    assert _mentioned(f"parasim {command}"), f"parasim {command} is not documented"
    missing = [
        option
        for action in _commands()[command]._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help" and not _mentioned(option)
    ]
    assert not missing, f"parasim {command}: flags not in README.md or docs/: {missing}"


def _schema_fields() -> set[str]:
    from simulator.request.scenario import ScenarioSpec

    names: set[str] = set()

    def walk(model) -> None:
        for name, field in model.model_fields.items():
            names.add(field.alias or name)
            for arg in _models_in(field.annotation):
                walk(arg)

    walk(ScenarioSpec)
    return names


def _models_in(annotation) -> list[type]:
    from pydantic import BaseModel

    found, stack = [], [annotation]
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            found.append(item)
        stack.extend(getattr(item, "__args__", ()))
    return found


def test_every_scenario_field_is_documented():
    missing = sorted(name for name in _schema_fields() if not _mentioned(name))
    assert not missing, f"scenario fields not in README.md or docs/: {missing}"


def test_the_command_reference_is_in_step_with_the_code(capsys):
    from simulator.cli.reference import main

    assert main(["--check"]) == 0, capsys.readouterr().err


def test_a_named_command_s_parser_is_the_one_the_whole_command_line_holds():
    """``parasim run ...`` declares run's options alone: they are the same options,
    with the same help and defaults, as in the parser of every command."""
    from simulator.cli.main import COMMANDS, _named

    every = _commands()
    assert list(every) == list(COMMANDS)
    for name in COMMANDS:
        parser = _parser(_named([name, "x"]))
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert list(sub.choices) == [name]
        assert sub.choices[name].format_help() == every[name].format_help()
    # the options of parasim itself come first: then every command is declared
    assert _named(["--help", "run"]) is None and _named(["bogus"]) is None and _named([]) is None
