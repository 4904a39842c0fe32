"""Real traces in: PyTorch profiler (Kineto) traces read, classified and turned into a
calibration profile, on public traces of real multi-GPU training runs
(``tests/traces/``, their origin in the README beside them) and on hand-written ones."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simulator.cli.main import main
from simulator.traces import kineto
from simulator.traces.calibration import calibrate_from_traces
from simulator.traces.kernels import classify_cpu_op, classify_kernel
from simulator.traces.kineto import Event, TraceError, read_trace, read_traces
from simulator.traces.labels import call_label, compute_label, read_call, read_compute
from simulator.traces.measure import dtype_bytes, gemm_key, gemm_shape, measure_traces
from topologies.profile import load_profile

FIXTURES = Path(__file__).parent / "traces" / "hta"
NCCL_RUN = FIXTURES / "nccl_parser_config" / "nccl_data.json.gz"
ALL_FIXTURES = sorted(FIXTURES.rglob("*.json.gz"))


@pytest.mark.parametrize(
    ("name", "family", "collective", "algorithm", "protocol"),
    [
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "communication",
            "all_reduce",
            "ring",
            "LL",
        ),
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "communication",
            "all_reduce",
            "ring",
            "LL",
        ),
        (
            "ncclDevKernel_ReduceScatter_Sum_f32_TREE_LL128(...)",
            "communication",
            "reduce_scatter",
            "tree",
            "LL128",
        ),
        (
            "ncclDevKernel_AllGather_RING_SIMPLE(...)",
            "communication",
            "all_gather",
            "ring",
            "Simple",
        ),
        (
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "communication",
            "p2p",
            "ring",
            "Simple",
        ),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_NVLS_SIMPLE(...)",
            "communication",
            "all_reduce",
            "nvls",
            "Simple",
        ),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1",
            "gemm",
            None,
            None,
            None,
        ),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm", None, None, None),
        ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn", "gemm", None, None, None),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x5_tn_align4>(...)",
            "gemm",
            None,
            None,
            None,
        ),
        (
            "void fbgemm_gpu::split_embedding_codegen_forward_kernel(...)",
            "elementwise",
            None,
            None,
            None,
        ),
        (
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)",
            "attention",
            None,
            None,
            None,
        ),
        (
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
            "attention",
            None,
            None,
            None,
        ),
        (
            "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0",
            "attention",
            None,
            None,
            None,
        ),
        (
            "void at::native::vectorized_layer_norm_kernel<float, float>(...)",
            "norm",
            None,
            None,
            None,
        ),
        (
            "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(...)",
            "norm",
            None,
            None,
            None,
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>(...)",
            "optimizer",
            None,
            None,
            None,
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>(...)",
            "elementwise",
            None,
            None,
            None,
        ),
        ("some_vendor_kernel_nobody_knows", "unknown", None, None, None),
    ],
)
def test_kernels_are_classified_by_their_families_names(
    name, family, collective, algorithm, protocol
):
    found = classify_kernel(name)
    assert (found.family, found.collective, found.algorithm, found.protocol) == (
        family,
        collective,
        algorithm,
        protocol,
    )


def test_a_cpu_run_s_ops_and_gloo_ranges_are_classified():
    assert classify_cpu_op("aten::mm").family == "gemm"
    assert (
        classify_cpu_op("aten::_scaled_dot_product_flash_attention_for_cpu").family == "attention"
    )
    assert classify_cpu_op("aten::native_layer_norm").family == "norm"
    assert classify_cpu_op("aten::copy_").family == "elementwise"
    gloo = classify_cpu_op("gloo:all_reduce")
    assert (gloo.family, gloo.collective) == ("communication", "all_reduce")
    assert classify_cpu_op("my_python_function").family == "unknown"


def _op(name: str, dims: list, types: list) -> Event:
    return Event(name, "cpu_op", 0.0, 1e-3, 1, 1, {"Input Dims": dims, "Input type": types})


@pytest.mark.parametrize(
    ("name", "dims", "types", "shape"),
    [
        ("aten::mm", [[512, 256], [256, 1024]], ["c10::BFloat16"] * 2, (512, 1024, 256, 1, False)),
        (
            "aten::addmm",
            [[1024], [512, 256], [256, 1024], [], []],
            ["float"] * 3,
            (512, 1024, 256, 1, False),
        ),
        ("aten::bmm", [[8, 128, 64], [8, 64, 128]], ["float"] * 2, (128, 128, 64, 8, False)),
        (
            "aten::linear",
            [[4, 128, 4096], [11008, 4096], []],
            ["c10::BFloat16"] * 2,
            (512, 11008, 4096, 1, False),
        ),
        ("aten::matmul", [[2, 64, 32], [32, 16]], ["float"] * 2, (128, 16, 32, 1, False)),
        (
            "aten::_scaled_mm",
            [[64, 128], [128, 256]],
            ["c10::Float8_e4m3fn"] * 2,
            (64, 256, 128, 1, True),
        ),
        ("aten::mm", [[512, 256]], ["float"], None),
        ("aten::relu", [[512, 256]], ["float"], None),
    ],
)
def test_gemm_shapes_come_from_the_recorded_inputs(name, dims, types, shape):
    assert gemm_shape(_op(name, dims, types)) == shape


def test_a_gemm_is_keyed_as_parasim_lowers_one():
    from simulator.arithmetic.layer_ops import _gemm

    lowered = _gemm("fc1", 512, 1024, 256)
    assert gemm_key(512, 1024, 256, 1, False) == (
        lowered.kind,
        lowered.flops,
        lowered.bytes,
        lowered.shape,
        lowered.batch,
        lowered.fp8,
    )


def test_labels_read_back_to_the_bit():
    label = read_compute(compute_label("gemm", 0.1 + 0.2, 1 / 3, (128, 256, 64), 2, True))
    assert label is not None
    assert label.key == ("gemm", 0.1 + 0.2, 1 / 3, (128, 256, 64), 2, True)
    assert read_compute(compute_label("elementwise", 65536.0, 1e6, None, 1, False)).shape is None
    call = read_call(call_label(7, "all_reduce", "tp0", (0, 1), 131072.0))
    assert call is not None and (call.op, call.kind, call.group, call.members) == (
        7,
        "all_reduce",
        "tp0",
        (0, 1),
    )
    assert read_compute("aten::mm") is None and read_call("parasim.call|x|y") is None


def test_data_types_have_their_sizes():
    assert [
        dtype_bytes(t) for t in ("Float", "c10::BFloat16", "Long", "c10::Float8_e4m3fn", "?")
    ] == [4, 2, 8, 1, None]


# -- the public traces ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_kernel_of_a_real_trace_is_classified_or_named_unknown_with_its_time(path):
    trace = read_trace(path)
    measured = measure_traces([trace])
    raw = json.loads(gzip.decompress(path.read_bytes()))
    kernels = [
        e
        for e in raw["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    assert kernels, "the fixture has GPU kernels"
    total = sum(e["dur"] for e in kernels) * 1e-6
    counted = sum(seconds for _, seconds in measured.families.values())
    assert counted == pytest.approx(total, rel=1e-9)
    assert sum(count for count, _ in measured.families.values()) == len(kernels)
    unknown = {
        e["name"] for e in kernels if classify_kernel(e["name"], e["cat"]).family == "unknown"
    }
    assert set(measured.unknown) == unknown
    for name, (count, seconds) in measured.unknown.items():
        own = [e for e in kernels if e["name"] == name]
        assert count == len(own) and seconds == pytest.approx(sum(e["dur"] for e in own) * 1e-6)


def test_nccl_kernels_are_read_as_their_own_records_say():
    measured = measure_traces([read_trace(NCCL_RUN)])
    raw = json.loads(gzip.decompress(NCCL_RUN.read_bytes()))
    kinds = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    expected = sorted(
        (
            kinds[e["args"]["Collective name"]],
            e["args"]["Group size"],
            float(e["args"]["In msg nelems"] * {"Float": 4, "Long": 8}[e["args"]["dtype"]]),
            e["dur"] * 1e-6,
        )
        for e in raw["traceEvents"]
        if e.get("cat") == "kernel" and e["name"].startswith("nccl")
    )
    got = sorted((c.kind, c.ranks, c.bytes, c.seconds) for c in measured.calls)
    assert len(got) == len(expected) == 7
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    assert [g[3] for g in got] == pytest.approx([e[3] for e in expected])
    assert {(c.algorithm, c.protocol, c.members) for c in measured.calls} == {
        ("ring", "LL", (0, 1))
    }


def test_gemm_shapes_of_a_real_run_become_the_profile_s_gemm_table(tmp_path):
    control = FIXTURES / "trace_diff" / "control"
    profile, measured, _ = calibrate_from_traces([control], preset="dgx-a100")
    gemms = [s for s in measured.ops if s.family == "gemm"]
    shaped = [s for s in gemms if s.shape is not None]
    assert len(shaped) > 100 and len(shaped) / len(gemms) > 0.9
    assert len(profile["gpu"]["gemm_table"]) > 50
    assert 0 < profile["gpu"]["matmul_efficiency"] <= 1
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    loaded = load_profile(path)  # checked as strictly as parasim calibrate's
    assert len(loaded.gpu.op_table) == len({s.key for s in shaped})


@pytest.mark.parametrize("folder", sorted({p.parent for p in ALL_FIXTURES}), ids=lambda p: p.name)
def test_every_public_trace_makes_a_profile_parasim_reads(folder, tmp_path):
    out = tmp_path / "profile.json"
    assert (
        main(["calibrate", "--from-trace", str(folder), "--preset", "dgx-a100", "--out", str(out)])
        == 0
    )
    load_profile(out)


def test_the_command_names_the_kernels_it_could_not_classify(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["calibrate", "--from-trace", str(NCCL_RUN), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "unclassified kernel" in printed and "cask_cudnn_infer" in printed
    assert json.loads(out.read_text())["trace"]["unknown"]


# -- refusals ---------------------------------------------------------------------------------


def _write(path: Path, payload) -> Path:
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a PyTorch profiler trace"),
        ({"traceEvents": {}}, "not a PyTorch profiler trace"),
        ({"traceEvents": [], "otherData": {"fidelity": "flow"}}, "parasim's own trace"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ],
)
def test_a_file_that_is_not_a_profiler_trace_is_one_line(tmp_path, capsys, content, message):
    path = _write(tmp_path / "rank0.json", content)
    assert main(["calibrate", "--from-trace", str(path), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


def test_events_with_impossible_times_are_skipped_and_counted(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm_a", "ts": 0, "dur": 5, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "gemm_b", "ts": 1e400, "dur": 5, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "gemm_c", "ts": 3, "dur": -1, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "gemm_d", "ts": "3", "dur": 1, "pid": 0, "tid": 7},
    ]
    trace = read_trace(_write(tmp_path / "t.json", {"schemaVersion": 1, "traceEvents": events}))
    assert [e.name for e in trace.events] == ["gemm_a"] and trace.skipped == 3


def test_a_trace_past_the_size_bound_is_refused(tmp_path, monkeypatch):
    path = _write(tmp_path / "big.json", {"schemaVersion": 1, "traceEvents": [{"x": "y" * 2000}]})
    monkeypatch.setattr(kineto, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(TraceError, match="larger than"):
        read_trace(path)


def test_two_files_of_one_rank_are_refused_and_foreign_files_passed_over(tmp_path):
    one = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": []}
    _write(tmp_path / "a.json", one)
    _write(tmp_path / "b.json", one)
    with pytest.raises(TraceError, match="both rank 0"):
        read_traces([tmp_path])
    (tmp_path / "b.json").unlink()
    _write(tmp_path / "result.json", {"step_time_s": 1.0})
    traces, passed_over = read_traces([tmp_path])
    assert [t.path.name for t in traces] == ["a.json"] and [p.name for p in passed_over] == [
        "result.json"
    ]


def test_nothing_to_read_is_one_line(tmp_path, capsys):
    assert (
        main(["calibrate", "--from-trace", str(tmp_path), "--out", str(tmp_path / "p.json")]) == 2
    )
    assert "no PyTorch profiler trace" in capsys.readouterr().err


def test_from_trace_runs_no_benchmark_of_its_own(tmp_path, capsys):
    args = ["calibrate", "--from-trace", str(NCCL_RUN), "--out", str(tmp_path / "p.json")]
    assert main([*args, "--quick"]) == 2
    assert "--quick: not with --from-trace" in capsys.readouterr().err


def test_a_gpu_no_preset_describes_needs_its_peak(tmp_path, capsys):
    test = FIXTURES / "trace_diff" / "test"  # a V100
    assert main(["calibrate", "--from-trace", str(test), "--out", str(tmp_path / "p.json")]) == 2
    assert "V100" in capsys.readouterr().err
    out = tmp_path / "p.json"
    args = [
        "calibrate",
        "--from-trace",
        str(test),
        "--peak-flops",
        "125 TFLOP/s",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    assert load_profile(out).gpu.peak_flops == pytest.approx(125e12)


def _gpu_rank(rank: int, gemm_us: float, allreduce_us: float) -> dict:
    """A labelled GPU rank as ``parasim replay --profile`` records one on a GPU: the op's
    range on the host, the ATen op and its launch inside it, the kernel on the device
    (linked by the launch's correlation only, as older traces do)."""
    label = compute_label(
        "gemm", 2.0 * 64 * 128 * 32, 2.0 * (64 * 32 + 32 * 128 + 64 * 128), (64, 128, 32), 1, False
    )
    call = call_label(3, "all_reduce", "tp0", (0, 1), 4096.0)
    host = {"pid": 10, "tid": 10}
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}],
        "host_name": "node0",  # one host: the call is inside a node
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#0",
                "ts": 0,
                "dur": 900,
                **host,
            },
            {"ph": "X", "cat": "user_annotation", "name": label, "ts": 10, "dur": 30, **host},
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "ts": 12,
                "dur": 20,
                **host,
                "args": {"External id": 5},
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 15,
                "dur": 5,
                **host,
                "args": {"correlation": 77},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "sm90_xmma_gemm_bf16bf16",
                "pid": 0,
                "tid": 7,
                "ts": 50,
                "dur": gemm_us,
                "args": {"correlation": 77, "External id": 77},
            },
            {"ph": "X", "cat": "user_annotation", "name": call, "ts": 60, "dur": 30, **host},
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 70,
                "dur": 5,
                **host,
                "args": {"correlation": 78},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)",
                "pid": 0,
                "tid": 13,
                "ts": 300,
                "dur": allreduce_us,
                "args": {"correlation": 78},
            },
            # the same call again (a fit needs two): its kernel linked by the ATen op
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": call_label(4, "all_reduce", "tp0", (0, 1), 4096.0),
                "ts": 700,
                "dur": 30,
                **host,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "ts": 705,
                "dur": 20,
                **host,
                "args": {"External id": 9},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)",
                "pid": 0,
                "tid": 13,
                "ts": 800,
                "dur": allreduce_us,
                "args": {"External id": 9},
            },
        ],
    }


def test_a_labelled_gpu_replay_s_ops_take_their_kernels_times(tmp_path):
    for rank, (gemm, allreduce) in enumerate([(100.0, 400.0), (120.0, 250.0)]):
        _write(tmp_path / f"rank{rank}.json", _gpu_rank(rank, gemm, allreduce))
    profile, measured, _ = calibrate_from_traces([tmp_path])
    (row,) = profile["gpu"]["op_table"]
    assert row["shape"] == [64, 128, 32] and row["seconds"] == pytest.approx(110e-6)  # no host gap
    calls = {(c.kind, c.ranks, c.bytes, c.algorithm, c.protocol, c.seconds) for c in measured.calls}
    assert len(measured.calls) == 2 and len(calls) == 1
    (call,) = calls
    # the member that arrived last waited least: its kernel's time is the call's
    assert call == ("all_reduce", 2, 4096.0, "ring", "LL", pytest.approx(250e-6))
    table = profile["comm"]["all_reduce"]["intra_node"]["table"]
    assert table == [{"ranks": 2, "bytes": 4096.0, "seconds": pytest.approx(250e-6)}]


def test_a_kernel_s_name_is_printed_with_its_control_characters_quoted(tmp_path, capsys):
    """A trace is someone else's file: an unclassified kernel whose name carries terminal
    escapes or a right-to-left override is named with those characters quoted."""
    for rank in (0, 1):
        trace = _gpu_rank(rank, 100.0, 200.0)
        # a trace of someone's own run: no parasim labels, the kernels are what it holds
        trace["traceEvents"] = [
            e
            for e in trace["traceEvents"]
            if e["cat"] != "user_annotation" or e["name"].startswith("ProfilerStep#")
        ]
        launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 5}
        trace["traceEvents"] += [
            {**launch, "pid": 10, "tid": 10, "ts": 690, "args": {"correlation": 99}},
            {
                "ph": "X",
                "cat": "kernel",
                "name": "my_kernel\x1b[2J\u202eevil",
                "pid": 0,
                "tid": 7,
                "ts": 700,
                "dur": 10,
                "args": {"correlation": 99},
            },
        ]
        _write(tmp_path / f"rank{rank}.json", trace)
    out = tmp_path / "profile.json"
    assert main(["calibrate", "--from-trace", str(tmp_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "my_kernel\\x1b[2J\\u202eevil" in printed
    assert "\x1b" not in printed and "\u202e" not in printed
