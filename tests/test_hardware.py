"""The hardware backend for real: gloo CPU processes, no mocks.

Each test launches 2-4 local ranks through torch's elastic launcher, as
``parasim replay`` and ``parasim calibrate`` do.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from hardware.launch import RUN_DIR_PREFIX, launch_local, remove_stale_run_dirs  # noqa: E402
from hardware.runtime import HardwareError  # noqa: E402
from simulator.cli.main import main  # noqa: E402
from simulator.request.scenario import apply_overrides, load_scenario  # noqa: E402
from simulator.run.simulate import per_rank_schedule, run_scenario  # noqa: E402

from .conftest import ROOT, SCENARIOS  # noqa: E402
from .helpers import TINY  # noqa: E402

pytestmark = pytest.mark.hardware  # and so slow: see tests/conftest.py

LLAMA = [
    "model.kv_heads=1",  # one KV head, replicated on both TP ranks
    "model.mlp=swiglu",
    "model.norm=rmsnorm",
    "model.position=rope",
    "model.bias=false",
    "model.tie_embeddings=false",
    "model.dropout=false",
    "model.ffn_hidden=704",
]
LAYOUTS = {
    "dp": ["parallel.tp=1", "parallel.dp=2"],
    "tp": ["parallel.tp=2", "parallel.dp=1"],
    "pp": ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1"],
    "tp-pp-dp": ["cluster.gpus_per_node=4", "parallel.tp=2", "parallel.pp=2", "parallel.dp=1"],
    "tp-dp": ["cluster.gpus_per_node=4", "parallel.tp=2", "parallel.dp=2"],
    "zb-h1": ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1", "parallel.schedule=zb-h1"],
    # two chunks per rank as a V: the turn's hand-over stays on rank 1, rank 0 holds
    # both the embedding and the loss
    "zbv": [
        "parallel.tp=1",
        "parallel.pp=2",
        "parallel.dp=1",
        "parallel.schedule=zbv",
        "parallel.virtual_stages=2",
        "model.layers=4",
    ],
    # DualPipeV: the same V, and in the steady state a forward of one micro-batch
    # overlapped with the backward of another, their ops interleaved on one stream
    "dualpipev": [
        "parallel.tp=1",
        "parallel.pp=2",
        "parallel.dp=1",
        "parallel.schedule=dualpipev",
        "parallel.virtual_stages=2",
        "model.layers=4",
    ],
    # ... with experts: one micro-batch's all-to-alls beside the other's compute
    "dualpipev-moe": [
        "cluster.gpus_per_node=4",
        "parallel.tp=1",
        "parallel.pp=2",
        "parallel.dp=2",
        "parallel.ep=2",
        "parallel.schedule=dualpipev",
        "parallel.virtual_stages=2",
        "model.layers=4",
        "training.global_batch=8",
        "model.moe={experts: 4, top_k: 2}",
    ],
    # FSDP: each layer's weights gathered before its forward and backward, its
    # gradients reduce-scattered after its backward
    "fsdp": ["parallel.tp=1", "parallel.dp=2", "training.sharding=full"],
    "hsdp": [
        "cluster.gpus_per_node=4",
        "parallel.tp=1",
        "parallel.dp=4",
        "parallel.dp_shard=2",
        "training.sharding=full",
    ],
    # a shared expert beside the routed ones, overlapped with the all-to-alls
    "moe-shared": [
        "parallel.tp=1",
        "parallel.dp=2",
        "parallel.ep=2",
        "model.moe={experts: 4, top_k: 2, shared_experts: 1, overlap_shared_experts: true}",
    ],
    # context parallelism: a ring of K/V blocks, and Ulysses' all-to-alls
    "cp-ring": ["parallel.tp=1", "parallel.dp=1", "parallel.cp=2", "model.seq_len=64"],
    "cp-ulysses": [
        "parallel.tp=1",
        "parallel.dp=1",
        "parallel.cp=2",
        "parallel.cp_kind=ulysses",
        "model.seq_len=64",
    ],
    "fsdp-pp": [
        "cluster.gpus_per_node=4",
        "parallel.tp=1",
        "parallel.pp=2",
        "parallel.dp=2",
        "training.sharding=full",
        "training.reshard_after_forward=false",
    ],
    # a Llama-style block: GQA, SwiGLU, RMSNorm, RoPE, no biases, untied embeddings;
    # FlashAttention is replayed as scaled_dot_product_attention, unfused as bmm
    "llama-flash": [*LLAMA, "parallel.tp=2"],
    "llama-unfused-sp": [*LLAMA, "parallel.tp=2", "parallel.sp=true", "training.attention=unfused"],
    "moe-ep": [
        "parallel.tp=1",
        "parallel.dp=2",
        "parallel.ep=2",
        "model.moe={experts: 4, top_k: 2, routing: {kind: zipf, exponent: 1.0}}",
    ],
}
SCENARIO = str(SCENARIOS / "cpu-tiny.yaml")


def _sets(overrides: list[str]) -> list[str]:
    return [f"--set={o}" for o in overrides]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_replay_times_every_op_and_checks_collectives(name, tmp_path):
    overrides = TINY + LAYOUTS[name]
    scenario = load_scenario(SCENARIO, overrides)
    launch_local(
        "hardware.replay",
        [SCENARIO, "--out", str(tmp_path), "--warmup", "1", "--steps", "2", *_sets(overrides)],
        scenario.layout.world,
        "gloo",
        60,
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["fidelity"] == "measured"
    assert result["measured"]["verified_collectives"] is True
    assert len(result["measured"]["step_times_s"]) == 2
    # a measurement carries no trust interval: that is a prediction's
    assert result["interval"] is None and "step_time_interval_s" not in result
    assert result["step_time_s"] > 0
    for row in result["per_rank"]:
        assert sum(row["breakdown"].values()) == pytest.approx(result["step_time_s"], rel=1e-9)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    timed = [e for e in events if e["ph"] == "X"]
    total_ops = sum(len(p.ops) for p in run_scenario(scenario).schedule.programs.values())
    assert len(timed) == total_ops
    assert all(e["dur"] >= 0 and math.isfinite(e["ts"]) for e in timed)


@pytest.mark.parametrize("fidelity", ["analytic", "flow"])
def test_replay_runs_every_op_whatever_the_fidelity(fidelity, tmp_path):
    """The simulator folds and blocks analytic steps; the hardware always gets the plain
    per-rank IR, so both fidelities measure the same ops."""
    overrides = [*TINY, "parallel.tp=1", "parallel.dp=2", f"simulation.fidelity={fidelity}"]
    launch_local(
        "hardware.replay",
        [SCENARIO, "--out", str(tmp_path), "--warmup", "0", "--steps", "1", *_sets(overrides)],
        2,
        "gloo",
        60,
    )
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    # trace.json names a collective "nccl:<kind> <label>"
    measured = sorted(e["name"].split(" ")[-1] for e in events if e["ph"] == "X")
    scenario = load_scenario(SCENARIO, [*TINY, "parallel.tp=1", "parallel.dp=2"])
    plain = per_rank_schedule(scenario)
    assert sorted(plain.programs) == [0, 1]
    assert measured == sorted(op.label for p in plain.programs.values() for op in p.ops)


def test_every_collective_kind_and_uneven_all_to_all_are_correct(tmp_path, monkeypatch):
    out = tmp_path / "counts"
    monkeypatch.setenv("PARASIM_TEST_OUT", str(out))
    launch_local("tests.hw_collectives_worker", [], 3, "gloo", 60)
    counts = ast.literal_eval(out.read_text())
    assert all(timed == total and total > 0 for timed, total in counts)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    assert (
        main(["calibrate", "--nproc", "2", "--backend", "gloo", "--quick", "--out", str(path)]) == 0
    )
    return path


def test_calibration_writes_a_profile_that_changes_the_prediction(profile):
    data = json.loads(profile.read_text())
    assert data["format"] == "parasim-calibration" and data["version"] == 1
    assert data["device"]["count"] == 2 and data["software"]["backend"] == "gloo"
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p"} <= set(
        data["comm"]
    )
    for scopes in data["comm"].values():
        fit = scopes["intra_node"]
        assert fit["bandwidth"] > 0 and fit["alpha"] >= 0 and math.isfinite(fit["rms_residual_s"])
    assert 0 < data["gpu"]["matmul_efficiency"] <= 1
    plain = run_scenario(load_scenario(SCENARIO))
    calibrated = run_scenario(load_scenario(SCENARIO, [f"cluster.profile={profile}"]))
    assert calibrated.scenario.cluster_spec.calibration is not None
    assert (
        calibrated.scenario.cluster_spec.gpu.matmul_efficiency == data["gpu"]["matmul_efficiency"]
    )
    assert calibrated.result.step_time_s != plain.result.step_time_s


def test_closed_loop_calibrate_predict_replay_compare(profile, tmp_path, capsys):
    predicted, measured = tmp_path / "predicted", tmp_path / "measured"
    assert (
        main(["run", SCENARIO, "--set", f"cluster.profile={profile}", "--out", str(predicted)]) == 0
    )
    assert (
        main(["replay", SCENARIO, "--backend", "gloo", "--steps", "2", "--out", str(measured)]) == 0
    )
    capsys.readouterr()
    assert main(["compare", str(predicted), str(measured), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    error = report["step_time"]["error"]
    assert error is not None and math.isfinite(error)
    assert report["op_classes"] and (measured / "compare.html").exists()


def test_calibration_at_a_scenario_s_shapes_prices_every_op_it_runs(tmp_path):
    """``calibrate --scenario`` times every distinct compute op of its scenarios, sweeps
    their collective sizes and their uneven all-to-alls, and measures the executor's own
    costs and the ranks' jitter; the simulator then takes every compute op's time from
    the profile."""
    from hardware.opbench import scenario_uneven_all_to_alls
    from simulator.engine.compute import ComputeModel

    skewed_moe = "model.moe={experts: 4, top_k: 2, routing: {kind: zipf, exponent: 1.5}}"
    layouts = {
        "tp": TINY + LAYOUTS["tp"],
        "ep": TINY + ["parallel.tp=1", "parallel.dp=2", "parallel.ep=2", skewed_moe],
    }
    files = []
    for name, overrides in layouts.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(apply_overrides(yaml.safe_load(Path(SCENARIO).read_text()), overrides))
        )
        files.append(path)
    path = tmp_path / "profile.json"
    argv = ["calibrate", "--nproc", "2", "--backend", "gloo", "--quick", "--out", str(path)]
    assert main([*argv, "--scenario", str(files[0]), "--scenario", str(files[1])]) == 0
    data = json.loads(path.read_text())
    assert data["device"]["cores"] >= 1
    assert data["executor"]["compute_op_s"] >= 0 and data["executor"]["collective_s"] >= 0
    assert 0 <= data["gpu"]["jitter"] <= 0.5
    schedules = [per_rank_schedule(load_scenario(f, [f"cluster.profile={path}"])) for f in files]
    computed = {
        (op.kind, op.flops, op.bytes, op.shape, op.batch, op.fp8)
        for schedule in schedules
        for program in schedule.programs.values()
        for op in program.ops
        if op.type == "compute"
    }
    table = {
        (
            row["kind"],
            row["flops"],
            row["bytes"],
            tuple(row["shape"]) if row["shape"] else None,
            row["batch"],
            row["fp8"],
        )
        for row in data["gpu"]["op_table"]
    }
    assert table == computed
    for file in files:
        model = ComputeModel(load_scenario(file, [f"cluster.profile={path}"]).cluster_spec)
        assert model.measured_ops == len(computed)
    # the tp layout's all-reduce sizes are among the swept ones
    sizes = {row["bytes"] for row in data["comm_rows"]["all_reduce/intra_node"]}
    wanted = {
        op.bytes
        for program in schedules[0].programs.values()
        for op in program.ops
        if op.type == "collective" and op.kind == "all_reduce"
    }
    assert wanted and all(any(abs(s - w) <= 8 for s in sizes) for w in wanted)
    # the skewed MoE's dispatches and combines, timed with their own splits
    uneven = [row for row in data["comm_rows"]["all_to_all/intra_node"] if row.get("uneven")]
    cases = scenario_uneven_all_to_alls(schedules[1:], 2)
    assert cases and len(uneven) == len(cases)
    assert all(row["seconds"] > 0 for row in uneven)
    # both scenarios' steps ran for real: every call they make was measured in place,
    # and the prediction prices each with that measurement
    for file in files:
        run = run_scenario(load_scenario(file, [f"cluster.profile={path}"]))
        choices = run.times.collective_choices
        assert choices and all(key.endswith("/measured") for key in choices), choices
    tables = [fit["table"] for fits in data["comm"].values() for fit in fits.values()]
    assert all(call["seconds"] > 0 and call["ranks"] == 2 for t in tables for call in t)


def test_a_replay_records_how_it_measured(tmp_path):
    overrides = TINY + LAYOUTS["dp"]
    launch_local(
        "hardware.replay",
        [SCENARIO, "--out", str(tmp_path), "--steps", "4", *_sets(overrides)],
        2,
        "gloo",
        60,
    )
    measured = json.loads((tmp_path / "result.json").read_text())["measured"]
    steps = measured["step_times_s"]
    assert len(steps) == 4 and measured["median_s"] == sorted(steps)[1]
    assert measured["spread"] == pytest.approx((max(steps) - min(steps)) / measured["median_s"])
    assert measured["cpu_count"] >= 1 and measured["load_average_1m"] >= 0
    assert len(measured["cpu_per_wall"]) == 2 and all(r > 0 for r in measured["cpu_per_wall"])
    pinned = measured["pinned_cpus"]
    if len(os.sched_getaffinity(0)) >= 2:  # each rank on cores of its own
        assert all(pinned) and not set(pinned[0]) & set(pinned[1])
    assert measured["steal_fraction"] is None or 0 <= measured["steal_fraction"] <= 1


def test_the_step_begins_when_the_last_rank_leaves_the_barrier():
    from hardware.replay import common_clock

    # rank 1 left the barrier 2 ms after rank 0 (origins on the common clock)
    steps = [
        ([0.0, 0.004], [0.0, 0.004], [0.004, 0.010], 100.000),
        ([0.0, 0.003], [0.0, 0.003], [0.003, 0.009], 100.002),
    ]
    shifted, step = common_clock(steps)
    assert step == pytest.approx(0.009)  # not 0.011: the barrier's skew is not counted
    assert shifted[0][0] == [0.0, pytest.approx(0.002)]
    assert shifted[0][2] == [pytest.approx(0.002), pytest.approx(0.008)]
    assert shifted[1][2] == [0.003, 0.009]


def test_ranks_connect_over_the_interface_named(tmp_path):
    """``--ifname`` (for torchrun across nodes) picks the interface gloo and NCCL use; a
    name the host does not have is one line naming the host's interfaces."""
    overrides = _sets(TINY + LAYOUTS["dp"])
    args = [SCENARIO, "--steps", "1", *overrides, "--ifname"]
    launch_local("hardware.replay", [*args, "lo", "--out", str(tmp_path / "a")], 2, "gloo", 30)
    assert (tmp_path / "a" / "result.json").exists()
    with pytest.raises(HardwareError) as info:
        launch_local(
            "hardware.replay", [*args, "nosuch0", "--out", str(tmp_path / "b")], 2, "gloo", 30
        )
    assert "--ifname: this host" in str(info.value) and "has no interface 'nosuch0'" in str(
        info.value
    )
    assert "lo" in str(info.value).split("it has ")[1]


@contextlib.contextmanager
def _ended_within(seconds: float) -> Iterator[None]:
    """Fail, rather than hang, a test whose run never ends: after ``seconds`` (far
    beyond what the run takes even on a busy machine) SIGALRM interrupts it, and the
    launcher stops its ranks on the way out."""

    def give_up(signum: int, frame: object) -> None:
        raise AssertionError(f"the run had not ended after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


#: The longest a faulty run below may take before the test gives up on it: the fault
#: would otherwise hold it for good (a hung rank sleeps a million seconds).
NEVER_S = 300


def test_a_killed_rank_fails_the_run_in_time_and_is_named(tmp_path, monkeypatch):
    """The peer of a killed rank notices at once (its connection is reset), not when
    its timeout runs out: no timeout is named, whatever the machine's load."""
    monkeypatch.setenv("PARASIM_FAULT", "1:4:kill")
    overrides = TINY + LAYOUTS["tp"]
    with _ended_within(NEVER_S), pytest.raises(HardwareError) as info:
        launch_local(
            "hardware.replay", [SCENARIO, "--out", str(tmp_path), *_sets(overrides)], 2, "gloo", 60
        )
    message = str(info.value)
    assert "rank 1 was killed by SIGKILL" in message
    assert "timeout" not in message and "stopped responding" not in message
    assert not (tmp_path / "result.json").exists()


def test_a_hung_rank_ends_the_run_within_the_timeout(tmp_path, monkeypatch):
    """A rank that hangs is ended by its own watchdog once the timeout has passed
    without progress, and its peer by its collective's timeout: the run ends because
    of the timeout, which both ranks' reports name, and the hung rank's own clock says
    how long after the hang (the watchdog looks once a second). The timeout is long
    enough that the ranks' start-up (which it also bounds) fits on a busy machine."""
    monkeypatch.setenv("PARASIM_FAULT", "1:4:hang")
    overrides = TINY + LAYOUTS["tp"]
    timeout_s = 8
    with _ended_within(NEVER_S), pytest.raises(HardwareError) as info:
        launch_local(
            "hardware.replay",
            [SCENARIO, "--out", str(tmp_path), *_sets(overrides)],
            2,
            "gloo",
            timeout_s,
        )
    message = str(info.value)
    # the hung rank is named as such; its peer timed out waiting, not a wrong result
    hung = re.search(
        rf"rank 1: stopped responding at op 4 .*: no progress for (\d+) s "
        rf"\(timeout {timeout_s} s\)",
        message,
    )
    assert hung, message
    assert timeout_s <= int(hung.group(1)) <= 2 * timeout_s
    # its peer ends at its collective's timeout, or, on a busy machine where that comes
    # later, at its own watchdog's: either way the report names the timeout for it too
    peer = f"within the {timeout_s} s timeout (a peer stopped responding)" in message
    watched = re.search(
        rf"rank 0: stopped responding at op \d+ .*\(timeout {timeout_s} s\)", message
    )
    assert peer or watched, message
    assert "wrong result" not in message


def test_replay_refuses_a_wrong_process_count(capsys):
    assert main(["replay", SCENARIO, "--nproc", "3", "--backend", "gloo"]) == 2
    assert "needs 2 ranks" in capsys.readouterr().err


def test_impossible_process_counts_exit_2_before_starting(capsys, tmp_path):
    assert (
        main(["calibrate", "--nproc", "0", "--backend", "gloo", "--out", str(tmp_path / "p.json")])
        == 2
    )
    assert "--nproc: must be at least 1 (got 0)" in capsys.readouterr().err
    big = [  # 128 ranks, beyond this machine's cores
        *("--set", "cluster.nodes=64", "--set", "parallel.dp=64"),
        *("--set", "training.global_batch=64", "--set", "training.micro_batch=1"),
    ]
    assert main(["replay", SCENARIO, *big, "--backend", "gloo", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "ranks are more than this machine runs on gloo" in err and err.count("\n") == 1
    assert not (tmp_path / "m").exists() and list(tmp_path.iterdir()) == []


def _processes() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, state) of every process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def _tree(root: int, remembered: set[int] | None = None) -> set[int]:
    """``root`` and its live descendants (and any of ``remembered`` still alive)."""
    table = _processes()
    alive = {pid for pid, (_, state) in table.items() if state != "Z"}
    found = {root} & alive
    grew = True
    while grew:
        children = {pid for pid in alive if table[pid][0] in found} - found
        found |= children
        grew = bool(children)
    return found | ((remembered or set()) & alive)


def _start_long_replay(out: Path) -> tuple[subprocess.Popen, set[int]]:
    """``parasim replay`` of 500 steps on 2 gloo ranks, in a session of its own, once
    its ranks run their steps: the command and the processes it started."""
    command = [sys.executable, "-m", "simulator.cli.main", "replay", SCENARIO]
    command += ["--backend", "gloo", "--steps", "500", "--out", str(out)]
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while len(_tree(proc.pid)) < 3 and time.monotonic() < deadline:  # launcher, 2 ranks
        time.sleep(0.2)
    started = _tree(proc.pid)
    assert len(started) >= 3, "the ranks did not start"
    time.sleep(2)
    return proc, _tree(proc.pid, started)


def _listening(pids: set[int]) -> list[str]:
    """The local addresses of the TCP sockets that ``pids`` listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    addresses = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.append(fields[1])
    return addresses


def _is_loopback(address: str) -> bool:
    """A /proc/net/tcp{,6} address (hex, as the kernel writes it) on the loopback."""
    host = address.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian: 127.x.x.x ends in 7F
        return host.endswith("7F")
    mapped = host.startswith("0000000000000000FFFF0000") and host.endswith("7F")
    return host == "00000000000000000000000001000000" or mapped  # ::1, ::ffff:127.x


def test_a_local_replay_listens_only_on_the_loopback_interface(tmp_path):
    proc, started = _start_long_replay(tmp_path / "m")
    try:
        ranks = started - {proc.pid}
        addresses = _listening(started)
        deadline = time.monotonic() + 60  # a busy machine may still be importing torch
        while not addresses and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            started = _tree(proc.pid, started)
            addresses = _listening(started)
        assert addresses, "the ranks' gloo connections should be listening somewhere"
        assert all(_is_loopback(a) for a in addresses), addresses
        assert len(ranks) >= 2
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)


def test_a_killed_launcher_leaves_no_rank_and_no_result(tmp_path):
    """SIGKILL to the command alone, which can then stop nothing: the kernel kills its
    ranks as it dies, and the next launch removes the run folder it could not."""
    proc, started = _start_long_replay(tmp_path / "m")
    run_dirs = list(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{proc.pid}-*"))
    assert len(run_dirs) == 1, run_dirs
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60  # generous: the ranks would run 500 steps
    while _tree(proc.pid, started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _tree(proc.pid, started) == set(), "ranks outlived their launcher"
    # no result written by ranks without a launcher (the command's own staging folder,
    # made before the ranks started, is the command's to clean)
    assert not list((tmp_path / "m").rglob("result.json"))
    assert run_dirs[0].exists()  # a launcher killed outright cannot remove it
    launch_local("platform", [], 1, "gloo", 60)  # the next launch, of a module that prints
    assert not run_dirs[0].exists()


def test_only_the_run_folders_of_ended_launchers_are_removed(tmp_path):
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    dead = int(ended.stdout)
    stale = tmp_path / f"{RUN_DIR_PREFIX}{dead}-x1y2"
    live = tmp_path / f"{RUN_DIR_PREFIX}{os.getpid()}-a3b4"
    other = tmp_path / f"{RUN_DIR_PREFIX}notapid-c5d6"
    for folder in (stale, live, other):
        (folder / "store").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / f"{RUN_DIR_PREFIX}{dead}-link"
    link.symlink_to(elsewhere)
    assert remove_stale_run_dirs(str(tmp_path)) == [stale]
    assert not stale.exists()
    assert live.exists() and other.exists() and link.is_symlink() and elsewhere.exists()


def test_ctrl_c_during_a_replay_ends_it_in_one_line_with_no_process_left(tmp_path):
    proc, started = _start_long_replay(tmp_path / "m")
    interrupted = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - interrupted < 10
    assert proc.returncode == 130
    assert err.decode().strip().splitlines() == ["parasim: interrupted"]
    time.sleep(0.5)
    assert _tree(proc.pid, started) == set(), "no rank outlives the command"
    assert not (tmp_path / "m").exists()  # nothing half-written where the results go
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_replay_on_a_terminal_shows_what_it_is_doing(tmp_path):
    """On a terminal, ``parasim replay`` shows a status line while its ranks work (and
    clears it), and still writes its folder."""
    import pty

    out = tmp_path / "measured"
    command = [sys.executable, "-m", "simulator.cli.entry", "replay", SCENARIO, "--out", str(out)]
    command += ["--steps", "2", "--warmup", "1", "--backend", "gloo"]
    command += [f"--set={o}" for o in TINY + LAYOUTS["dp"]]
    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, stdout=follower, stderr=follower, cwd=ROOT)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=120) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "replaying cpu-tiny on 2 ranks (gloo)" in text
    assert f"wrote {out}" in text and (out / "result.json").exists()
