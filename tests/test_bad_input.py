"""Bad input ends in one line naming the field and the numbers, exit status 2, no
traceback, and nothing already written is touched."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from simulator.cli.main import main
from simulator.common.errors import DeadlockError
from simulator.engine.core import simulate
from simulator.request.orders import dump_csv_order
from simulator.schedule.ir import Collective, Compute, Program, Recv, Schedule
from simulator.schedule.pipeline import one_f_one_b_order

from .conftest import ROOT, SCENARIOS
from .helpers import cluster

SMALL = str(SCENARIOS / "small.yaml")

CASES = [
    (["--set", "parallel.tpp=2"], "parallel.tpp: unknown key (did you mean 'tp'?)"),
    (["--set", "trainin.global_batch=2"], "trainin: unknown key (did you mean 'training'?)"),
    (
        ["--set", "cluster.gpu.matmul_effciency=0.5"],
        "cluster.gpu.matmul_effciency: unknown key (did you mean 'matmul_efficiency'?)",
    ),
    (["--set", "training.global_batch=lots"], "training.global_batch"),
    (["--set", "parallel.tp=two"], "parallel.tp"),
    (["--set", "cluster.nic.bandwidth=0 Gb/s"], "cluster.nic.bandwidth"),
    (["--set", "cluster.nvswitch.bandwidth=fast"], "cluster.nvswitch.bandwidth"),
    (
        ["--set", "model.preset=gpt3-176b"],
        "model.preset: unknown model 'gpt3-176b' (did you mean 'gpt3-175b'?)",
    ),
    (["--set", "parallel.dp=2"], "tp(2) * pp(1) * dp(2) = 4 != world(8)"),
    (
        ["--set", "parallel.tp=8", "--set", "parallel.dp=1", "--set", "model.heads=12"],
        "heads(12) is not divisible by tp(8)",
    ),
    (
        [
            "--set",
            "parallel.tp=1",
            "--set",
            "parallel.pp=8",
            "--set",
            "parallel.dp=1",
            "--set",
            "model.layers=12",
        ],
        "layers(12) do not divide over pp(8) stages, and an uneven split needs at least 2",
    ),
    (
        ["--set", "training.global_batch=10"],
        "global_batch(10) is not divisible by dp(4) * micro_batch(4) = 16",
    ),
    (
        ["--set", "parallel.tp=3", "--set", "parallel.dp=null"],
        "world(8) is not divisible by tp(3) * pp(1) = 3",
    ),
    (["--set", "parallel.placement=[tp, tp, pp]"], "parallel.placement"),
    (["--set", "parallel.schedule=zigzag"], "parallel.schedule"),
    (["--set", "cluster.preset=dgx-a200"], "dgx-a200"),
    (["--set", "noequals"], "--set 'noequals': expected key.path=value"),
    (
        ["--set", "training.micro_batch=0"],
        "training.micro_batch: Input should be greater than 0 (got 0)",
    ),
    (["--set", "model.hidden=100"], "model.heads: hidden(100) is not divisible by heads(12)"),
    (["--set", "cluster.nodes=0"], "cluster.nodes: must be >= 1 (got 0)"),
    (["--set", "cluster.nods=2"], "cluster.nods: unknown key (did you mean 'nodes'?)"),
    # non-finite, boolean and overflowing numbers are refused at load, naming the field
    (["--set", "model.moe={experts: 4, top_k: 2, capacity_factor: .inf}"], "capacity_factor"),
    (["--set", "cluster.gpu.matmul_efficiency=.nan"], "cluster.gpu.matmul_efficiency"),
    (["--set", "model.hidden=1.0e+200"], "model.hidden: 1e+200 is too large"),
    (["--set", "model.layers=9223372036854775808"], "model.layers: 9.22337e+18 is too large"),
    (["--set", "parallel.tp=true"], "parallel.tp: expected a number, not true"),
    (["--set", "cluster.nodes=true"], "cluster.nodes"),
    (["--set", "simulation.seed=-1"], "simulation.seed"),
    (["--set", "cluster.nic.bandwidth=450"], "give a unit, e.g. '450 GB/s'"),
    # runs that cannot work on this machine stop before they start
    (["--set", "cluster.nodes=125000000", "--set", "parallel.dp=null"], "at most 1048576"),
    (
        [
            *("--set", "cluster.nodes=16000", "--set", "parallel.dp=null"),
            *("--set", "training.global_batch=2048000", "--set", "simulation.fidelity=flow"),
            *("--set", "simulation.fold=false"),
        ],
        "the step is too large to simulate here: about 5.07e+08 ops",
    ),
]


@pytest.mark.parametrize("extra,expected", CASES)
def test_bad_input_exits_2_with_one_line(extra, expected, capsys, tmp_path):
    code = main(["run", SMALL, "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert err.count("\n") == 1 and err.startswith("parasim: error: ")
    assert not any(tmp_path.iterdir())  # nothing written


def test_missing_file_and_bad_yaml(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read scenario" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncluster: [unclosed\n")
    assert main(["run", str(bad)]) == 2
    assert "not valid YAML at line" in capsys.readouterr().err


def test_a_failed_run_leaves_earlier_results_intact(tmp_path):
    assert main(["run", SMALL, "--out", str(tmp_path)]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {
        "result.json",
        "trace.json",
        "timeline.html",
        "report.html",
        "plotly.min.js",
        ".parasim",
    }
    assert main(["run", SMALL, "--out", str(tmp_path), "--set", "parallel.tp=3"]) == 2
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_command_line_prints_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "simulator.cli.main", "run", SMALL, "--set", "parallel.tpp=2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "parasim: error: parallel.tpp: unknown key (did you mean 'tp'?); "
        "valid keys: cp, cp_kind, dp, dp_replicate, dp_shard, ep, placement, pp, schedule, "
        "schedule_file, sp, stage_layers, tp, virtual_stages"
    ]


def test_recv_without_send_names_the_stuck_rank_and_op():
    programs = {
        0: Program(0, [Compute(0, "compute", 1e9, 0, "gemm", "work")]),
        1: Program(
            1,
            [
                Recv(0, "pp_recv_fwd", 0, 1024, 7, "recv.act.mb0"),
                Compute(1, "compute", 1e9, 0, "gemm", "needs.act", deps=(0,)),
            ],
        ),
    }
    with pytest.raises(DeadlockError) as info:
        simulate(Schedule(programs, {}), cluster(nodes=1))
    message = str(info.value)
    assert "rank 1" in message and "recv.act.mb0" in message and "no matching send" in message
    assert "needs.act" in message


def test_collective_a_member_never_reaches_names_the_missing_rank():
    programs = {
        0: Program(0, [Collective(0, "tp", "all_reduce", "g", 1e6, "L0.ar")]),
        1: Program(1, [Compute(0, "compute", 1e9, 0, "gemm", "busy")]),
    }
    with pytest.raises(
        DeadlockError, match=r"rank 0 tp: op 0 L0.ar \(all_reduce on g: ranks \[1\] never arrived\)"
    ):
        simulate(Schedule(programs, {"g": (0, 1)}), cluster(nodes=1))


def test_a_device_a_folder_or_a_huge_file_is_refused_before_reading(tmp_path, capsys):
    for path, reason in (("/dev/zero", "not a regular file"), (str(tmp_path), "a folder")):
        assert main(["run", path]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"parasim: error: {path}: cannot read scenario ({reason}")
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as handle:
        handle.truncate(17 * 2**20)
    assert main(["run", str(huge)]) == 2
    assert "more than any configuration file" in capsys.readouterr().err
    sets = ["--set", "parallel.schedule=custom", "--set", "parallel.schedule_file=/dev/zero"]
    assert main(["run", SMALL, *sets, "--out", str(tmp_path / "o")]) == 2
    assert "parallel.schedule_file: /dev/zero: not a regular file" in capsys.readouterr().err


def test_a_schedule_file_is_found_next_to_its_scenario(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    scenario = yaml.safe_load((SCENARIOS / "small.yaml").read_text())
    scenario["parallel"].update(tp=2, pp=2, dp=2, schedule="custom", schedule_file="order.csv")
    scenario["training"].update(global_batch=16, micro_batch=2)
    scenario["model"] = {**scenario.get("model", {}), "layers": 12}
    (folder / "s.yaml").write_text(yaml.safe_dump(scenario))
    dump_csv_order(one_f_one_b_order(2, 4), folder / "order.csv")
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    assert main(["run", str(folder / "s.yaml"), "--out", str(tmp_path / "o")]) == 0


def test_a_custom_order_that_deadlocks_names_the_global_ranks(tmp_path, capsys):
    path = tmp_path / "stuck.csv"
    # rank 0 wants micro-batch 0's gradient before it sends micro-batch 1's input
    path.write_text("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n")
    sets = [
        *("--set", "parallel.tp=2", "--set", "parallel.pp=2", "--set", "parallel.dp=2"),
        *("--set", "training.global_batch=4", "--set", "training.micro_batch=1"),
        *("--set", "parallel.schedule=custom", "--set", f"parallel.schedule_file={path}"),
    ]
    assert main(["run", SMALL, *sets, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "pipeline rank 1" in err and "pipeline rank 1 is global ranks" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["nope"],
        ["run", "x.yaml", "--outputs", "foo"],
        ["run", "x.yaml", "--fidelity", "\x1b]0;PWNED\x07"],
        ["sweep", "x.yaml", "--workers", "many"],
    ],
)
def test_a_command_line_argparse_refuses_is_one_quoted_line(argv, capsys):
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": error: " in err and "--help)" in err, err
    assert "\x1b" not in err and "\x07" not in err
