# ruff: noqa: E501  (benchmark bodies are code strings run in their own process)
"""The speed targets of parasim, in one command, with figure, target and ratio.

Each benchmark runs in a fresh Python process (so its peak memory is its own) with a
time limit, and reports its wall time and peak resident memory. The ``cli-*`` ones run
the command as a user does, in a child process, and also report the output folder's
largest file and its copies of plotly.js (targets: none over 20 MB, one copy):

==================  ==========================================================  ==========
name                what                                                         target
==================  ==========================================================  ==========
1t-analytic         one step of a 1T GPT (Megatron's: 160 heads, h 25600,       ≤ 5 s,
                    128 layers, s 2048, V 51200) on 3072 A100s, tp 8 pp 64      ≤ 2 GB
                    dp 6, global batch 3072, micro-batch 1, analytic
1t-flow             the same in flow fidelity                                     ≤ 120 s,
                                                                                  ≤ 8 GB
gpt3-128-flow       gpt3-175b on 128 GPUs, flow, every rank, 64 micro-batches     ≤ 60 s
sweep-175b-1024     ``parasim sweep`` of gpt3-175b on 1024 A100s                  ≤ 30 s
sweep-175b-1024-    the same sweep rerun with its result cache                    ≤ 2 s
cached
sweep-175b-1024-    the same sweep on a 2-worker Dask ``LocalCluster`` ÷ on the   ≤ 1.2×
dask                2-process pool, both timed in one process, in turn, best of
                    two each
cli-help            ``parasim --help``, the whole command                         ≤ 0.5 s
cli-small           ``parasim run scenarios/small.yaml``, the whole command      ≤ 1.5 s
cli-1t-analytic     ``parasim run`` of 1t-analytic's scenario with every output   ≤ 4 s
                    (and, timed apart in a process of their own, the
                    simulation and the outputs: outputs ≤ 25% of the whole
                    command; their share of the simulation and the outputs
                    alone is shown too); best of two runs of each, in turn
cli-gpt3-128-flow   ``parasim run`` of gpt3-128-flow's scenario ÷ the simulation  ≤ 1.3×
                    alone; best of two runs of each, in turn
cli-mixtral-skewed  ``parasim run scenarios/mixtral-ep-skewed.yaml``            ≤ 30 s
cli-405b-SIZE-      ``parasim run`` of Llama 3 405B, tp 8 pp 16, data             analytic
FIDELITY            parallelism growing with the cluster (1k, 16k, 64k and 131k   ≤ 3 s,
                    GPUs; 32 micro-batches of 1 per replica), ``--outputs         flow
                    result``, in analytic and flow fidelity                       ≤ 30 s
cli-405b-analytic-  the 131k command ÷ the 1k command, analytic, in turn, best    ≤ 1.5×
growth              of three each
cli-deepseek-v3-    ``parasim run scenarios/deepseek-v3-like-ep.yaml``, every     ≤ 10 s,
ep-FIDELITY         output, analytic (as shipped) and flow                        ≤ 60 s
cli-mixtral-8x22b-  ``parasim run`` of Mixtral 8x22B on 128 H100s (tp 2 pp 4      ≤ 3 s
128                 dp 16 ep 8), ``--outputs result``
cli-explain-        ``parasim explain`` of the same                               ≤ 20 s
mixtral-8x22b-128
cli-sweep-mixtral-  ``parasim sweep scenarios/mixtral-ep.yaml --gpus 256``        ≤ 60 s
ep-256
cli-sweep-175b-     ``parasim sweep scenarios/gpt3-175b.yaml --gpus 1024``, cold  ≤ 10 s
1024
cli-175b-vs-        ``parasim run scenarios/gpt3-175b.yaml --outputs result``      ≤ 1×
calculon            analytic ÷ Calculon's ``calculon llm`` on the same layout
                    (gpt3-175B, 128 A100s, tp 8 pp 8 dp 2, batch 64, micro-batch
                    1, full recompute: benchmarks/calculon/), both from the same
                    interpreter's directory, their modules' bytecode compiled
                    first (as an install leaves it), in turn, best of five
                    each, parasim's output piped (its plain summary; the notes
                    give the same command drawing rich tables for a terminal);
                    needs a Calculon checkout in CALCULON (and
                    CALCULON_PYTHON, an interpreter with its pandas; default
                    this one)
engine-overhead     simulated events (op completions) per second in a flow      ≥ 0.5
                    replay of gpt3-175b (128 ranks, every op), ÷ the timeouts
                    per second of a bare SimPy loop; both measured in turn in
                    one process, best of 3 and of 4 (the machine is noisy)
==================  ==========================================================  ==========

Usage::

    python -m benchmarks.bench_speed [--only NAME ...] [--limit SECONDS]
    python -m benchmarks.bench_speed --compare REV     # the same benchmarks on git REV too

``--compare`` checks REV out in a temporary git worktree and runs these same
benchmarks against its code, so two revisions are measured by one harness in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ONE_T = {
    "name": "megatron-1t",
    "cluster": {"preset": "dgx-a100", "nodes": 384},
    "model": {"preset": "megatron-1t"},
    "training": {"global_batch": 3072, "micro_batch": 1},
    "parallel": {"tp": 8, "pp": 64, "dp": 6},
    "simulation": {"fidelity": "analytic"},
}

# Mixtral 8x22B on 16 DGX H100 nodes (128 GPUs): tp 2, pp 4, dp 16, ep 8, ZeRO-1
MIXTRAL_8X22B = {
    "name": "mixtral-8x22b-128",
    "cluster": {"preset": "dgx-h100", "nodes": 16},
    "model": {"preset": "mixtral-8x22b"},
    "training": {
        "global_batch": 256,
        "micro_batch": 1,
        "recompute": "full",
        "sharding": "optimizer",
    },
    "parallel": {"tp": 2, "pp": 4, "dp": 16, "ep": 8},
    "simulation": {"fidelity": "analytic"},
}


def llama405b_at(gpus: int, fidelity: str) -> list[str]:
    """``parasim run`` arguments for Llama 3 405B at tp 8 x pp 16 on ``gpus`` H100s, data
    parallelism growing with the cluster and each replica keeping its 32 micro-batches
    of 1 (the shipped scenario's), in ``fidelity``, its ``result.json`` only."""
    dp = gpus // 128
    return [
        "run",
        "scenarios/llama3-405b.yaml",
        *("--set", f"cluster.nodes={gpus // 8}"),
        *("--set", f"parallel.dp={dp}"),
        *("--set", f"training.global_batch={32 * dp}"),
        *("--set", f"simulation.fidelity={fidelity}"),
        *("--outputs", "result", "--out", "{out}"),
    ]


# The simulation and the outputs of one scenario timed apart, as ``parasim run`` runs
# them, printed as one JSON line (run in a fresh process by _COMMAND).
_SPLIT = """
import json, sys, time
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.report.outputs import write_run_outputs
t = time.perf_counter()
run = run_scenario(load_scenario({path!r}, {overrides!r}))
simulate_s = time.perf_counter() - t
t = time.perf_counter()
write_run_outputs(run, __import__('pathlib').Path({out!r}), title='bench')
print(json.dumps({{'simulate_s': simulate_s, 'outputs_s': time.perf_counter() - t}}))
"""

# The whole command as a user runs it, in a child process (its wall time, its peak
# memory, the output folder's largest file and its copies of plotly.js); with ``split``
# (a scenario path and its overrides), also the simulation and the outputs timed apart
# in a fresh process of their own, as the command runs them. The two run in turn
# ``repeats`` times and each figure is the best of them: on a shared machine one run of
# a 20-second command moves by a quarter, and a ratio of two single runs by more.
_COMMAND = """
import json, os, pathlib, resource, subprocess, sys, tempfile, time, yaml
tmp = pathlib.Path(tempfile.mkdtemp())
one_t = tmp / 'one-t.yaml'
one_t.write_text(yaml.safe_dump(ONE_T))
mixtral = tmp / 'mixtral-8x22b.yaml'
mixtral.write_text(yaml.safe_dump(MIXTRAL))
argv = [a.replace('{{one_t}}', str(one_t)).replace('{{mixtral}}', str(mixtral)).replace('{{out}}', str(tmp / 'out')) for a in {argv!r}]
split = {split!r}
runs = []
for attempt in range({repeats}):
    t = time.perf_counter()
    done = subprocess.run([sys.executable, '-m', 'simulator.cli.entry', *argv], capture_output=True)
    if done.returncode not in {ok!r}:  # explain exits 1 when it finds a mistake
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    run_figure = {{'command_s': time.perf_counter() - t}}
    if split:  # in a fresh process too, so that no cache is warmer than the command's
        path, overrides = split
        code = SPLIT.format(path=path.replace('{{one_t}}', str(one_t)), overrides=overrides,
                            out=str(tmp / 'split'))
        done = subprocess.run([sys.executable, '-c', code], check=True, capture_output=True,
                              text=True)
        run_figure.update(json.loads(done.stdout.splitlines()[-1]))
    runs.append(run_figure)
figure = {{key: min(r[key] for r in runs) for key in runs[0]}}
if split:
    figure['outputs_share'] = figure['outputs_s'] / figure['command_s']
    figure['outputs_share_of_two'] = figure['outputs_s'] / (figure['simulate_s'] + figure['outputs_s'])
if len(runs) > 1:
    figure['runs'] = runs
figure['peak_rss_bytes'] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
files = [f for f in (tmp / 'out').rglob('*') if f.is_file()] if (tmp / 'out').exists() else []
figure['largest_file_mb'] = max((f.stat().st_size for f in files), default=0) / 1e6
figure['plotly_copies'] = sum(b'plotly.js v' in f.read_bytes()[:6_000_000] for f in files)
import shutil
shutil.rmtree(tmp, ignore_errors=True)
"""


# One configuration as a whole command, parasim's and Calculon's (a checkout of
# github.com/calculon-ai/calculon in $CALCULON, run by $CALCULON_PYTHON, which has its
# pandas), in turn, best of five each, printed as one JSON line. Both packages' bytecode
# is compiled first, as installing them leaves it: a checkout run where Python may not
# write bytecode (PYTHONDONTWRITEBYTECODE) would compile every module at every start.
# The figure is the command as the benchmark runs it, its output piped (a plain
# summary); the same command drawing its summary for a terminal (rich tables,
# TTY_COMPATIBLE=1) is timed beside it, in the notes.
_VERSUS_CALCULON = """
import compileall, os, subprocess, sys, tempfile, time
from pathlib import Path
calculon = os.environ.get('CALCULON')
if not calculon or not (Path(calculon) / 'bin' / 'calculon').is_file():
    raise SystemExit('set CALCULON to a checkout of github.com/calculon-ai/calculon')
python = os.environ.get('CALCULON_PYTHON', sys.executable)
for package in ('simulator', 'topologies'):
    compileall.compile_dir(package, quiet=1)
subprocess.run([python, '-m', 'compileall', '-q', str(Path(calculon) / 'calculon')],
               check=True, capture_output=True)
tmp = Path(tempfile.mkdtemp())
ours = [sys.executable, '-m', 'simulator.cli.entry', 'run', 'scenarios/gpt3-175b.yaml',
        '--set', 'simulation.fidelity=analytic', '--outputs', 'result', '--out', str(tmp / 'p')]
theirs = [python, str(Path(calculon) / 'bin' / 'calculon'), 'llm',
          str(Path(calculon) / 'models' / 'gpt3-175B.json'),
          'benchmarks/calculon/gpt3-175b-tp8-pp8-dp2.json',
          str(Path(calculon) / 'systems' / 'a100_80g.json'), str(tmp / 'calculon.json')]
# Calculon's checkout on its path, not on parasim's (each import would look there first)
envs = {
    'parasim_s': dict(os.environ),
    'terminal_s': dict(os.environ, TTY_COMPATIBLE='1'),
    'calculon_s': dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, (calculon, os.environ.get('PYTHONPATH'))))),
}
times = {'parasim_s': [], 'terminal_s': [], 'calculon_s': []}
for _ in range(5):
    for key, argv in (('parasim_s', ours), ('terminal_s', ours), ('calculon_s', theirs)):
        t = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=envs[key])
        times[key].append(time.perf_counter() - t)
figure = {key: min(values) for key, values in times.items()}
figure['ratio'] = figure['parasim_s'] / figure['calculon_s']
figure['terminal_ratio'] = figure['terminal_s'] / figure['calculon_s']
figure['runs'] = times
"""


def _whole(argv: list[str], ok: tuple[int, ...] = (0,)) -> str:
    """:data:`_COMMAND` for one run of the command ``argv`` alone (exit codes ``ok``)."""
    return _COMMAND.format(ok=ok, argv=argv, split=None, repeats=1)


#: The most of a whole command's wall time its outputs may take, by benchmark.
OUTPUTS_SHARE = {"cli-1t-analytic": 0.25}

# name -> (python source run in a fresh process, printing one JSON line), target, unit
BENCHMARKS: dict[str, tuple[str, float, str]] = {
    "1t-analytic": (
        "from simulator.request.scenario import scenario_from_dict\n"
        "from simulator.run.simulate import run_scenario\n"
        f"raw = {ONE_T!r}\n"
        "run = run_scenario(scenario_from_dict(raw))\n"
        "figure = {'step_time_s': run.result.step_time_s, 'ops': run.result.simulation['ops']}\n",
        5.0,
        "s",
    ),
    "1t-flow": (
        "from simulator.request.scenario import scenario_from_dict\n"
        "from simulator.run.simulate import run_scenario\n"
        f"raw = {ONE_T!r}\n"
        "raw['simulation'] = {'fidelity': 'flow'}\n"
        "run = run_scenario(scenario_from_dict(raw))\n"
        "figure = {'step_time_s': run.result.step_time_s, 'ops': run.result.simulation['ops']}\n",
        120.0,
        "s",
    ),
    "gpt3-128-flow": (
        "from simulator.request.scenario import load_scenario\n"
        "from simulator.run.simulate import run_scenario\n"
        "s = load_scenario('scenarios/gpt3-175b.yaml', ['training.global_batch=128'])\n"
        "run = run_scenario(s)\n"
        "figure = {'step_time_s': run.result.step_time_s, 'ops': run.result.simulation['ops']}\n",
        60.0,
        "s",
    ),
    "sweep-175b-1024": (
        "from simulator.tools.sweep import run_sweep\n"
        "out = run_sweep('scenarios/gpt3-175b.yaml', gpus=1024, batch='fixed')\n"
        "figure = {'simulated': out.counts['simulated'], 'enumerated': out.counts['enumerated'],\n"
        "          'ms_per_simulated': 1e3 * out.timing_s['simulate'] / max(1, out.counts['simulated'])}\n",
        30.0,
        "s",
    ),
    "sweep-175b-1024-cached": (
        "import tempfile, time\n"
        "from simulator.tools.cache import ResultCache\n"
        "from simulator.tools.sweep import run_sweep\n"
        "folder = tempfile.mkdtemp()\n"
        "run_sweep('scenarios/gpt3-175b.yaml', gpus=1024, batch='fixed', cache=ResultCache(folder))\n"
        "t = time.perf_counter()\n"
        "out = run_sweep('scenarios/gpt3-175b.yaml', gpus=1024, batch='fixed', cache=ResultCache(folder))\n"
        "figure = {'command_s': time.perf_counter() - t, 'cached': out.timing_s['cached']}\n"
        "import shutil; shutil.rmtree(folder, ignore_errors=True)\n",
        2.0,
        "s",
    ),
    "sweep-175b-1024-dask": (
        "import time\n"
        "from simulator.tools.sweep import run_sweep\n"
        "times = {None: [], 'local': []}\n"
        "for scheduler in [None, 'local', None, 'local']:  # in turn: best of two each\n"
        "    t = time.perf_counter()\n"
        "    out = run_sweep('scenarios/gpt3-175b.yaml', gpus=1024, batch='fixed', workers=2, scheduler=scheduler)\n"
        "    times[scheduler].append(time.perf_counter() - t)\n"
        "    if scheduler is None:\n"
        "        pool = out\n"
        "    else:\n"
        "        assert out.to_json() == pool.to_json()\n"
        "pool_s, dask_s = min(times[None]), min(times['local'])\n"
        "figure = {'ratio': dask_s / pool_s, 'pool_s': pool_s, 'dask_s': dask_s, 'runs': times}\n",
        1.2,
        "x",
    ),
    "cli-help": (
        _whole(["--help"]),
        0.5,
        "s",
    ),
    "cli-small": (
        _whole(["run", "scenarios/small.yaml", "--out", "{out}"]),
        1.5,
        "s",
    ),
    "cli-1t-analytic": (
        _COMMAND.format(
            ok=(0,),
            # without recompute the 1T step does not fit in an A100's memory: the speed of
            # writing it is what is measured, so its exit status 3 is allowed
            argv=["run", "{one_t}", "--allow-oom", "--out", "{out}"],
            split=("{one_t}", []),
            repeats=2,
        ),
        4.0,
        "s",
    ),
    "cli-gpt3-128-flow": (
        _COMMAND.format(
            ok=(0,),
            argv=[
                "run",
                "scenarios/gpt3-175b.yaml",
                "--set",
                "training.global_batch=128",
                "--out",
                "{out}",
            ],
            split=("scenarios/gpt3-175b.yaml", ["training.global_batch=128"]),
            repeats=2,
        )
        + "figure['ratio'] = figure['command_s'] / figure['simulate_s']\n",
        1.3,
        "x",
    ),
    "cli-mixtral-skewed": (
        _whole(["run", "scenarios/mixtral-ep-skewed.yaml", "--out", "{out}"]),
        30.0,
        "s",
    ),
    # -- the largest clusters and MoE runs, whole commands ---------------------------
    **{
        f"cli-405b-{size}-{fidelity}": (
            _whole(llama405b_at(gpus, fidelity)),
            3.0 if fidelity == "analytic" else 30.0,
            "s",
        )
        for size, gpus in (("1k", 1024), ("16k", 16384), ("64k", 65536), ("131k", 131072))
        for fidelity in ("analytic", "flow")
    },
    "cli-405b-analytic-growth": (
        "import subprocess, sys, tempfile, time\n"
        "runs = {1024: [], 131072: []}\n"
        "for _ in range(3):  # in turn, best of three each: a ratio of one run's figures\n"
        "    for gpus in (1024, 131072):\n"
        "        out = tempfile.mkdtemp()\n"
        f"        argv = [a.replace('{{out}}', out) for a in {llama405b_at(0, 'analytic')!r}]\n"
        "        argv[3], argv[5], argv[7] = (f'cluster.nodes={gpus // 8}', f'parallel.dp={gpus // 128}',\n"
        "                                     f'training.global_batch={32 * (gpus // 128)}')\n"
        "        t = time.perf_counter()\n"
        "        subprocess.run([sys.executable, '-m', 'simulator.cli.entry', *argv], check=True, capture_output=True)\n"
        "        runs[gpus].append(time.perf_counter() - t)\n"
        "times = {gpus: min(values) for gpus, values in runs.items()}\n"
        "figure = {'ratio': times[131072] / times[1024], 'times': times, 'runs': runs}\n",
        1.5,
        "x",
    ),
    "cli-175b-vs-calculon": (
        _VERSUS_CALCULON,
        1.0,
        "x",
    ),
    "cli-deepseek-v3-ep-analytic": (
        _whole(["run", "scenarios/deepseek-v3-like-ep.yaml", "--out", "{out}"]),
        10.0,
        "s",
    ),
    "cli-deepseek-v3-ep-flow": (
        _whole(
            [
                "run",
                "scenarios/deepseek-v3-like-ep.yaml",
                *("--set", "simulation.fidelity=flow"),
                *("--out", "{out}"),
            ]
        ),
        60.0,
        "s",
    ),
    "cli-mixtral-8x22b-128": (
        _whole(["run", "{mixtral}", "--outputs", "result", "--out", "{out}"]),
        3.0,
        "s",
    ),
    "cli-explain-mixtral-8x22b-128": (
        _whole(["explain", "{mixtral}", "--out", "{out}"], ok=(0, 1)),
        20.0,
        "s",
    ),
    "cli-sweep-mixtral-ep-256": (
        _whole(["sweep", "scenarios/mixtral-ep.yaml", "--gpus", "256", "--out", "{out}"]),
        60.0,
        "s",
    ),
    "cli-sweep-175b-1024": (
        _whole(["sweep", "scenarios/gpt3-175b.yaml", "--gpus", "1024", "--out", "{out}"]),
        10.0,
        "s",
    ),
    "engine-overhead": (
        "from benchmarks.bench_run import bare_simpy_events_per_second\n"
        "from simulator.request.scenario import load_scenario\n"
        "from simulator.run.simulate import build_schedule\n"
        "from simulator.engine.core import simulate\n"
        "import time\n"
        "s = load_scenario('scenarios/gpt3-175b.yaml', ['simulation.fidelity=flow'])\n"
        "schedule = build_schedule(s)\n"
        "s.cluster\n"
        "bare, engine = [], []\n"
        "for _ in range(3):\n"
        "    bare.append(bare_simpy_events_per_second())\n"
        "    t = time.perf_counter(); times = simulate(schedule, s.cluster); dt = time.perf_counter() - t\n"
        "    engine.append(times.stats['ops'] / dt)\n"
        "bare.append(bare_simpy_events_per_second())\n"
        "figure = {'ratio': max(engine) / max(bare), 'ops': times.stats['ops'], 'ops_per_s': max(engine), 'bare_events_per_s': max(bare), 'simpy_events': times.stats['events']}\n",
        0.5,
        "ratio",
    ),
}

_WRAPPER = """
import json, resource, time
ONE_T = {one_t!r}
MIXTRAL = {mixtral!r}
SPLIT = {split!r}
_start = time.perf_counter()
{body}
_wall = time.perf_counter() - _start
print(json.dumps({{"wall_s": _wall, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **figure}}))
"""


def run_benchmark(name: str, code_root: Path, limit: float) -> dict:
    body, target, unit = BENCHMARKS[name]
    env = dict(os.environ, PYTHONPATH=f"{code_root}{os.pathsep}{ROOT}")
    # a command is timed as an installed one runs: from its compiled bytecode, kept
    # after the first run (an environment that turns that off compiles every module of
    # every command again, a tenth of a second or more)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                _WRAPPER.format(body=body, one_t=ONE_T, mixtral=MIXTRAL_8X22B, split=_SPLIT),
            ],
            cwd=code_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        return {
            "name": name,
            "status": f"did not finish in {limit:g} s",
            "target": target,
            "unit": unit,
        }
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"name": name, "status": f"failed: {last}", "target": target, "unit": unit}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    value = row["ratio"] if unit in ("ratio", "x") else row.get("command_s", row["wall_s"])
    met = value >= target if unit == "ratio" else value <= target
    if name in OUTPUTS_SHARE:  # the outputs' share of the whole command, too
        met = met and row["outputs_share"] <= OUTPUTS_SHARE[name]
    return {
        "name": name,
        "status": "met" if met else "not met",
        "value": value,
        "target": target,
        "unit": unit,
        **row,
    }


def print_rows(label: str, rows: list[dict]) -> None:
    print(f"\n{label}\n")
    print("| benchmark | figure | target | figure ÷ target | peak memory | status | notes |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        unit = row["unit"]
        above = unit == "ratio"
        suffix = {"ratio": "", "x": "×"}.get(unit, " s")
        target = ("≥ " if above else "≤ ") + f"{row['target']:g}{suffix}"
        if "value" not in row:
            print(f"| {row['name']} | - | {target} | - | - | {row['status']} | |")
            continue
        shown = f"{row['value']:.2f}{suffix}"
        memory = f"{row['peak_rss_bytes'] / 2**30:.2f} GiB"
        print(
            f"| {row['name']} | {shown} | {target} | {row['value'] / row['target']:.2f} | "
            f"{memory} | {row['status']} | {_notes(row)} |"
        )


def _notes(row: dict) -> str:
    """What a whole-command benchmark saw beside its time."""
    notes = []
    if "simulate_s" in row:
        notes.append(
            f"simulation {row['simulate_s']:.2f} s, outputs {row['outputs_s']:.2f} s: "
            f"{row['outputs_share']:.0%} of the command"
            + (f" (≤ {OUTPUTS_SHARE[row['name']]:.0%})" if row["name"] in OUTPUTS_SHARE else "")
            + f", {row['outputs_share_of_two']:.0%} of the two"
        )
    if "ms_per_simulated" in row:
        notes.append(
            f"{row['simulated']} of {row['enumerated']} layouts simulated, "
            f"{row['ms_per_simulated']:.1f} ms each"
        )
    if "pool_s" in row:
        notes.append(f"process pool {row['pool_s']:.1f} s, LocalCluster {row['dask_s']:.1f} s")
    if "calculon_s" in row:
        notes.append(
            f"parasim {row['parasim_s']:.3f} s, Calculon {row['calculon_s']:.3f} s; "
            f"drawing for a terminal {row['terminal_s']:.3f} s ({row['terminal_ratio']:.2f}×)"
        )
    if "cached" in row:
        notes.append(f"{row['cached']} outcomes read from the cache")
    if "largest_file_mb" in row:
        notes.append(
            f"largest file {row['largest_file_mb']:.1f} MB, plotly.js copies {row['plotly_copies']}"
        )
    return "; ".join(notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS))
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per benchmark")
    parser.add_argument("--compare", metavar="REV", help="also run on this git revision")
    args = parser.parse_args()
    names = args.only or list(BENCHMARKS)
    print_rows("this tree", [run_benchmark(n, ROOT, args.limit) for n in names])
    if args.compare:
        with tempfile.TemporaryDirectory() as tmp:
            worktree = Path(tmp) / "rev"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(worktree), args.compare],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            try:
                rows = [run_benchmark(n, worktree, args.limit) for n in names]
                print_rows(f"revision {args.compare}", rows)
            finally:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(worktree)],
                    cwd=ROOT,
                    capture_output=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
