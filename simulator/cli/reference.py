"""``docs/cli.md``: every command, each of its flags with its help and default, and
every cluster and model preset, written from the parser and the presets themselves so
the reference cannot drift from what the commands really take.

``python -m simulator.cli.reference`` rewrites ``docs/cli.md``; ``--check`` exits 1
when the file differs from what the code would write (the test suite runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.arithmetic.counts import parameter_count
from simulator.common.files import write_atomically
from simulator.request.model import MODEL_PRESETS
from simulator.request.scenario import preset_model
from topologies.build import load_preset, preset_names

__all__ = ["cli_reference", "main"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
    if action.metavar and action.option_strings:
        names += f" `{action.metavar}`"
    elif action.choices and action.option_strings:
        names += " `{" + ",".join(map(str, action.choices)) + "}`"
    return names


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _command_section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## `parasim {name}`", "", _cell(parser.description or ""), ""]
    lines += ["| argument | what it does |", "| --- | --- |"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        lines.append(f"| {_flag(action)} | {_cell(action.help or '')} |")
    return [*lines, ""]


def _cluster_rows() -> list[str]:
    lines = [
        "| preset | GPU | GPUs per node | peak (dense bf16) | memory |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in preset_names():
        raw = load_preset(name)
        gpu = raw.get("gpu", {})
        lines.append(
            f"| `{name}` | {gpu.get('name', '')} | {raw.get('gpus_per_node', '')} | "
            f"{gpu.get('peak_flops', '')} | {gpu.get('hbm_capacity', '')} |"
        )
    return lines


def _model_rows() -> list[str]:
    lines = [
        "| preset | layers | hidden | heads | sequence | vocabulary | experts (top-k) "
        "| parameters |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in MODEL_PRESETS:
        model, moe = preset_model(name)
        experts = f"{moe.experts} (top-{moe.top_k})" if moe is not None else ""
        params = parameter_count(model, moe) / 1e9
        lines.append(
            f"| `{name}` | {model.layers} | {model.hidden} | {model.heads} | {model.seq_len} "
            f"| {model.vocab} | {experts} | {params:.2f} B |"
        )
    return lines


def cli_reference() -> str:
    """The text of ``docs/cli.md``."""
    from simulator.cli.main import _parser

    parser = _parser()
    lines = [
        "# Commands, flags and presets",
        "",
        "Written by `python -m simulator.cli.reference` from parasim's own parser and "
        "presets (a test checks that it is in step). `parasim COMMAND --help` prints the "
        "same. Every command takes `--set KEY.PATH=VALUE` overrides where it reads a "
        "scenario, and exits 2 with a one-line message on bad input.",
        "",
    ]
    for name, command in _commands(parser).items():
        lines += _command_section(name, command)
    lines += [
        "## Cluster presets",
        "",
        "`cluster.preset` (or `collbench --preset`) names one of these; "
        "`topologies/presets/<name>.yaml` cites the source of every number.",
        "",
        *_cluster_rows(),
        "",
        "## Model presets",
        "",
        "`model.preset` names one of these; fields set beside it override the preset's. "
        "Parameters are parasim's count, embeddings included.",
        "",
        *_model_rows(),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is stale")
    options = args.parse_args(argv)
    text = cli_reference()
    if options.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is stale: run python -m simulator.cli.reference", file=sys.stderr)
            return 1
        return 0
    write_atomically(DOC, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
