"""The layering rule, enforced: every module imports only its own layer or lower ones,
no import cycle exists, and an import inside a function is only for an optional heavy
package (torch, plotly, kaleido), never to dodge a cycle or reach upward.

The layers, lowest first, are the folders of ``simulator/`` (docs/guide.md, "The code,
layer by layer"), with ``topologies/`` below
them all and ``hardware/`` between the reports and the command line. Imports are read
from the source with :mod:`ast`, so the test needs no package importable and sees
imports inside functions too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("topologies", "simulator", "hardware")

# lowest first; a module belongs to the first prefix that matches its name
LAYERS: tuple[tuple[str, ...], ...] = (
    ("topologies",),
    ("simulator.common",),
    ("simulator.request",),
    ("simulator.arithmetic",),
    ("simulator.schedule",),
    ("simulator.engine",),
    ("simulator.analysis",),
    ("simulator.run",),
    ("simulator.tools", "simulator.traces"),
    ("simulator.report",),
    ("hardware",),
    ("simulator.cli",),
    ("simulator",),  # the front door (simulator/__init__.py) re-exports from below
)
HEAVY = ("torch", "plotly", "kaleido")
# Upward imports and cycles still tolerated, as (importer, imported): empty means the
# rule holds everywhere.
ALLOWED: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} belongs to no layer: add its folder to LAYERS")


def _target(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _project_module(name: str) -> str | None:
    """The project module ``name`` refers to (a symbol's module when it names one)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported project module, at top level?) for every import in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    for node in tree.body:  # imports under `if TYPE_CHECKING:` or try/except at top
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(child) for child in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _target(module, node, path.name == "__init__.py")
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            target = _project_module(name)
            if target is not None and target != module:
                found.append((target, id(node) in top))
    return found


def _imports_heavy(module: str, seen: set[str] | None = None) -> bool:
    """Whether importing ``module`` imports torch, plotly or kaleido at top level."""
    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in HEAVY for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if (node.module or "").split(".")[0] in HEAVY:
                return True
    return any(_imports_heavy(t, seen) for t, top in _imports(module) if top)


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for module in MODULES:
        graph.add_node(module)
        for target, top in _imports(module):
            graph.add_edge(module, target, top=top)
    return graph


def test_every_import_goes_down_or_sideways():
    upward = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, b in _graph().edges
        if _layer(b) > _layer(a) and (a, b) not in ALLOWED
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_topologies_knows_nothing_of_the_simulator():
    wrong = [
        f"{a} imports {b}"
        for a, b in _graph().edges
        if a.startswith("topologies") and not b.startswith("topologies")
    ]
    assert not wrong, "\n".join(wrong)


def test_hardware_never_imports_tools_or_the_cli():
    wrong = [
        f"{a} imports {b}"
        for a, b in _graph().edges
        if a.startswith("hardware") and b.startswith(("simulator.tools", "simulator.cli"))
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = _graph()
    graph.remove_edges_from(ALLOWED)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_late_imports_only_for_heavy_packages():
    """A function may import a module late only when that module pulls in torch,
    plotly or kaleido, or when it is a command of the command line (``simulator.cli``):
    ``parasim --help`` builds every command's parser, so a command imports its
    machinery when it runs."""
    late = [
        f"{a} imports {b} inside a function"
        for a, b, top in _graph().edges(data="top")
        if not top
        and not _imports_heavy(b)
        and (a, b) not in ALLOWED
        and not a.startswith("simulator.cli.")
    ]
    assert not late, "\n".join(sorted(late))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_says_what_it_is(module):
    tree = ast.parse(MODULES[module].read_text())
    assert ast.get_docstring(tree), f"{module} has no docstring at the top"


def test_the_front_door_runs_a_scenario_and_its_result_reads_back():
    import simulator

    assert set(simulator.__all__) == {
        "__version__",
        "load_scenario",
        "run_scenario",
        "Scenario",
        "Recipe",
        "StepResult",
        "run_sweep",
        "run_scale",
        "explain",
    }
    assert all(hasattr(simulator, name) for name in simulator.__all__)
    scenario = simulator.load_scenario(ROOT / "scenarios" / "cpu-tiny.yaml")
    assert isinstance(scenario, simulator.Scenario)
    assert isinstance(scenario.recipe, simulator.Recipe)
    result = simulator.run_scenario(scenario).result
    assert isinstance(result, simulator.StepResult)
    assert simulator.StepResult.from_json(result.to_json()) == result


def test_the_command_line_s_help_imports_none_of_the_machinery():
    """``parasim --help`` and every command's ``--help`` build their parsers without
    importing plotly, numpy, networkx, pydantic, simpy or torch: the start feels
    instant (benchmarks/bench_speed.py times it)."""
    code = (
        "import sys, contextlib, io\n"
        "from simulator.cli.main import COMMANDS, _parser\n"
        "parser = _parser()\n"
        "for name in [None, *COMMANDS]:\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        parser.parse_args(['--help'] if name is None else [name, '--help'])\n"
    )
    heavy = {"plotly", "numpy", "networkx", "pydantic", "simpy", "torch", "rich"}
    assert _loaded_after(code, lambda module: module.split(".")[0] in heavy) == []


def _loaded_after(code: str, wanted: Callable[[str], bool]) -> list[str]:
    """The modules ``wanted`` picks that a fresh interpreter has loaded after ``code``."""
    probe = f"{code}\nimport sys\nprint(repr(sorted(sys.modules)))\n"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    return sorted({module for module in loaded if wanted(module)})


def test_only_the_scheduler_imports_dask_and_only_when_asked():
    """``distributed`` is optional (``parasim[cluster]``): one module imports it, inside
    the function that opens a cluster."""
    importers = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n.split(".")[0] in ("distributed", "dask") for n in names):
                importers[module] = id(node) in top
    assert importers == {"simulator.tools.scheduler": False}


def test_progress_shows_only_on_a_terminal_without_json(capsys, monkeypatch):
    import io

    from simulator.report.progress import Status, interactive

    assert not interactive()  # pytest captures stdout: not a terminal
    monkeypatch.setattr("sys.stdout", type("Tty", (io.StringIO,), {"isatty": lambda s: True})())
    assert interactive() and not interactive(json_output=True)
    with Status("working", enabled=False) as status:
        status.update("still working")
    assert capsys.readouterr().err == ""


def test_a_result_only_run_imports_no_page_machinery(tmp_path):
    """``parasim run --outputs result`` writes no page: plotly, the sweep's pages and the
    run's plan stay unimported (a one-configuration command is timed against the
    closed-form peers: benchmarks/bench_speed.py), even for a scenario with a run:."""
    code = (
        "import sys, contextlib, io\n"
        "from simulator.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['run', 'scenarios/small.yaml', '--set', 'run={{tokens: 1e9}}', "
        f"'--outputs', 'result', '--out', {str(tmp_path / 'out')!r}])\n"
    )
    pages = ("simulator.tools.plan", "simulator.tools.sweep", "simulator.report.sweep_report")
    assert _loaded_after(code, lambda m: m.split(".")[0] == "plotly" or m in pages) == []
