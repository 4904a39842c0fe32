"""Measure GEMM, grouped-GEMM and attention kernels on one GPU, and set the measurements
beside parasim's kernel models for that GPU's preset.

Two steps, so that the machine with the GPU needs only torch:

    python -m benchmarks.kernel_sweep measure --out kernels.json [--quick]
    python -m benchmarks.kernel_sweep compare kernels.json --preset hgx-h200
    python -m benchmarks.kernel_sweep compare benchmarks/measurements/h200-kernels.json \
        --preset hgx-h200

``measure`` times, with CUDA events (the wall clock on a CPU, where ``--quick`` keeps
the shapes small enough to test the script):

* dense BF16 GEMMs ``(m, n, k)``: squares, S. Bekman's best H100 shape, the projections
  of 4096- and 8192-wide transformer layers at 8192 tokens, short ``k`` and shapes one
  tile past a full wave of 132 SMs (where the shape model says the rate halves);
* grouped BF16 GEMMs (``torch._grouped_mm``, where this torch has it) at the
  Qwen3-30B-A3B expert shape (hidden 2048, expert FFN 768) with 128 experts split
  over 8 ranks, at several tokens per expert;
* causal attention forward plus backward through ``F.scaled_dot_product_attention``,
  each backend it can force (FlashAttention-2, cuDNN), head dimension 128, 16 heads,
  batch × sequence = 16k tokens as in FlashAttention-2's published figures;

and samples the SM clock and board power (NVML) while a long GEMM runs, the clock the
preset's ``sustained_clock_hz`` claims. Each kernel: three warm-ups, then the median of
``repeats`` samples of back-to-back calls (about 2 ms each), so that the host's
dispatch hides behind the GPU as in a training step (one call between two events would
count it). Operands stay the same across calls, so a small GEMM's may sit in L2.

Also measured: one Llama-style block forward and backward, eager and compiled, at the
shapes of validated runs; a whole one-GPU training step (embedding, blocks, output
layer, loss, AdamW); one block with a torchtitan-style MoE; each set beside the model's
time for a one-GPU torchtitan scenario of the same shape. And FP8 (e4m3) GEMMs at the
same shapes (``torch._scaled_mm``, one scale per tensor) and BF16 GEMMs ``4096 × n ×
4096`` for ``n`` from 256 to 8192 (the tile and wave steps of the shape model). The
measurement of one H200 is kept in ``benchmarks/measurements/``.

``compare`` prints, per kernel, the measured rate and the rate the preset's models give
for the same shape: ``peak · gemm_efficiency`` for GEMMs (simulator/engine/gemm.py),
the grouped model of simulator/engine/grouped_gemm.py, the tabulated attention rate of
simulator/engine/attention_kernels.py. These are microbenchmark rates, so the
training step's ``sustained_fraction`` is not applied.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

GEMM_SHAPES: list[tuple[int, int, int]] = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 16384, 16384),
    (2048, 2048, 13312),  # S. Bekman's best H100 SXM shape
    # 8192 tokens through a 4096-wide layer (Llama-3-8B: QKV 6144, FFN 14336)
    (8192, 6144, 4096),
    (8192, 4096, 4096),
    (8192, 28672, 4096),
    (8192, 4096, 14336),
    # an 8192-wide layer (Llama-3-70B: QKV 10240, FFN 28672), TP 8 shards
    (8192, 1280, 8192),
    (8192, 8192, 1024),
    (8192, 7168, 8192),
    (8192, 8192, 3584),
    # short k
    (8192, 8192, 256),
    (8192, 8192, 512),
    (8192, 8192, 1024),
    # waves of 256x128 tiles over 132 SMs: 11x12 = 132 tiles, then 133 (one past)
    (2816, 1536, 8192),
    (2816, 1664, 8192),
    (5632, 3072, 8192),
    (5632, 3200, 8192),
]
# n across 256..8192 at m = k = 4096: the tile and wave steps of the shape model
WAVE_SHAPES: list[tuple[int, int, int]] = [(4096, n, 4096) for n in range(256, 8193, 256)]
QUICK_GEMM_SHAPES = [(256, 256, 256), (512, 256, 384)]
# Qwen3-30B-A3B: hidden 2048, expert FFN 768, 128 experts, 8 per rank at EP 16 / 16
# at EP 8; rows per expert from a few hundred to a few thousand
GROUPED_SHAPES: list[tuple[int, int, int, int]] = [  # groups, rows per group, n, k
    (16, 512, 1536, 2048),  # gate+up: n = 2 x 768
    (16, 2048, 1536, 2048),
    (16, 4096, 1536, 2048),
    (16, 2048, 2048, 768),  # down
    (8, 4096, 1536, 2048),
    (8, 8192, 2048, 768),
]
QUICK_GROUPED_SHAPES = [(2, 64, 64, 64)]
# The same experts as Transformer Engine's GroupedLinear runs them for Megatron-Core
# (one cuBLAS GEMM per expert, round-robin over 4 streams: nvte_multi_tensor_gemm), for
# the forward (rows, n, k), the input gradient (rows, k, n) and the weight gradient
# (n, k, rows) of the Qwen3-30B-A3B experts at EP 8 (16 experts of 2048 rows) and EP 16
# (8 experts of 8192 rows, micro-batch 4)
EXPERT_LOOP_SHAPES: list[tuple[int, int, int, int]] = [  # groups, m, n, k
    (16, 2048, 1536, 2048),
    (16, 2048, 2048, 1536),
    (16, 1536, 2048, 2048),
    (16, 2048, 2048, 768),
    (16, 2048, 768, 2048),
    (16, 2048, 768, 2048),
    (8, 8192, 1536, 2048),
    (8, 8192, 2048, 768),
    (16, 512, 1536, 2048),
]
QUICK_EXPERT_LOOP_SHAPES = [(4, 64, 64, 64)]
EXPERT_STREAMS = 4
ATTENTION_SEQUENCES = [512, 1024, 2048, 4096, 8192, 16384]
QUICK_ATTENTION_SEQUENCES = [128]
# The attention shapes of validation runs, per GPU: (batch, query heads, key/value heads,
# sequence): Qwen3-30B-A3B (GQA 32/4), OLMo 2 1B, 7B and 13B at micro-batch 1,
# fms-fsdp's Llama-2 7B at micro-batch 2, Llama 3 70B under TP 8 (8 query heads, 1 KV
# head per rank) at 8k, GPT-3 175B under TP 8 at 2k
ATTENTION_CASES: list[tuple[int, int, int, int]] = [
    (1, 32, 4, 4096),
    (1, 16, 16, 4096),
    (1, 32, 32, 4096),
    (1, 40, 40, 4096),
    (2, 32, 32, 4096),
    (1, 8, 1, 8192),
    (1, 12, 12, 2048),
]
QUICK_ATTENTION_CASES = [(1, 4, 2, 128)]
# One Llama-style block (torchtitan's: RMSNorm in fp32, separate Q/K/V and gate/up
# projections, complex RoPE, SDPA, SwiGLU) forward and backward, bf16 parameters, as
# validated runs shape it: (name, hidden, heads, KV heads, FFN, sequence, micro-batch,
# eager or compile)
LAYER_CASES: list[tuple[str, int, int, int, int, int, int, str]] = [
    ("olmo2-1b", 2048, 16, 16, 8192, 4096, 1, "compile"),
    ("olmo2-7b", 4096, 32, 32, 11008, 4096, 1, "compile"),
    ("olmo2-13b", 5120, 40, 40, 13824, 4096, 1, "compile"),
    ("olmo2-13b", 5120, 40, 40, 13824, 4096, 1, "eager"),
    ("llama2-7b", 4096, 32, 32, 11008, 4096, 2, "eager"),
]
# A whole one-GPU training step (embedding, blocks, final norm, output layer, cross-
# entropy, AdamW on bf16 parameters with bf16 moments): (name, hidden, heads, FFN,
# layers, vocabulary, sequence, micro-batch, eager or compile)
STEP_CASES: list[tuple[str, int, int, int, int, int, int, int, str]] = [
    ("olmo2-1b", 2048, 16, 8192, 16, 100352, 4096, 1, "eager"),
    ("olmo2-1b", 2048, 16, 8192, 16, 100352, 4096, 1, "compile"),
]
QUICK_STEP_CASES = [("tiny", 256, 4, 512, 2, 1024, 128, 1, "eager")]
# One block with a mixture-of-experts MLP as torchtitan runs it (router in fp32, top-k,
# argsort, an index gather, torch._grouped_mm for w1, w3 and w2, the scores multiplied in
# fp32, index_add back), routing forced to balance as the Megatron-LM recipes force it:
# (name, hidden, heads, KV heads, experts, top-k, expert FFN, sequence, micro-batch)
MOE_CASES: list[tuple[str, int, int, int, int, int, int, int, int]] = [
    ("qwen3-30b-a3b", 2048, 32, 4, 128, 8, 768, 4096, 1),
]
QUICK_MOE_CASES = [("tiny-moe", 256, 4, 2, 8, 2, 128, 128, 1)]
QUICK_LAYER_CASES = [("tiny", 256, 4, 4, 512, 128, 1, "eager")]
ATTENTION_TOKENS = 16384
ATTENTION_HEADS = 16
HEAD_DIM = 128


def _timer(device: str):
    """``timed(fn, repeats)``: seconds per call of ``fn``, the median of ``repeats``
    samples, each sample enough back-to-back calls (about 2 ms of GPU work) that the
    host's launch time hides behind the GPU's, as in a training step; a single call
    between two events would count the host's dispatch as GPU time."""
    import torch

    def sample(fn, calls: int) -> float:
        if device != "cuda":
            began = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - began) / calls
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / calls

    def run(fn, repeats: int) -> float:
        for _ in range(3):
            fn()
        single = sample(fn, 1)
        calls = max(1, min(200, math.ceil(2e-3 / max(single, 1e-7))))
        return statistics.median(sample(fn, calls) for _ in range(repeats))

    return run


def _time_kernel(fields, make, flops: float, timed, repeats: int, errors=(RuntimeError,)):
    """One measured row: ``fields`` with the seconds and TFLOP/s of the call ``make()``
    builds (its operands made inside, so that a dtype or kernel this device lacks is
    reported in the row, not raised)."""
    try:
        seconds = timed(make(), repeats)
    except errors as error:
        return {**fields, "error": str(error)[:200]}
    return {**fields, "seconds": seconds, "tflops": flops / seconds / 1e12}


def _measure_gemms(device, dtype, shapes, repeats, timed) -> list[dict[str, Any]]:
    import torch

    def make(m, n, k):
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        return lambda: a @ b

    return [
        _time_kernel(
            {"m": m, "n": n, "k": k}, partial(make, m, n, k), 2 * m * n * k, timed, repeats
        )
        for m, n, k in shapes
    ]


def _measure_fp8_gemms(device, shapes, repeats, timed) -> list[dict[str, Any]]:
    """FP8 (e4m3) GEMMs through ``torch._scaled_mm`` with one scale per tensor, BF16 out."""
    import torch

    if device != "cuda":  # FP8 tensor cores only: a CPU emulates them, slowly
        return []

    def make(m, n, k):
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)

    errors = (RuntimeError, AttributeError, TypeError)
    return [
        _time_kernel(
            {"m": m, "n": n, "k": k}, partial(make, m, n, k), 2 * m * n * k, timed, repeats, errors
        )
        for m, n, k in shapes
    ]


def _measure_grouped(device, dtype, shapes, repeats, timed, fp8=False) -> list[dict[str, Any]]:
    """Grouped GEMMs: ``torch._grouped_mm`` in BF16, or ``torch._scaled_grouped_mm`` in
    FP8 (e4m3, a scale per row of the tokens and per output column of each weight)."""
    import torch

    grouped_mm = getattr(torch, "_scaled_grouped_mm" if fp8 else "_grouped_mm", None)
    if grouped_mm is None or (fp8 and device != "cuda"):
        return []

    def make(groups, rows, n, k):
        offs = torch.arange(1, groups + 1, device=device, dtype=torch.int32) * rows
        if not fp8:
            a = torch.randn(groups * rows, k, device=device, dtype=dtype)
            w = torch.randn(groups, n, k, device=device, dtype=dtype).transpose(-2, -1)
            return lambda: grouped_mm(a, w, offs=offs)
        a = torch.randn(groups * rows, k, device=device).to(torch.float8_e4m3fn)
        w = torch.randn(groups, n, k, device=device).to(torch.float8_e4m3fn).transpose(-2, -1)
        scale_a = torch.ones(groups * rows, device=device)
        scale_w = torch.ones(groups, n, device=device)
        return lambda: grouped_mm(a, w, scale_a, scale_w, offs=offs, out_dtype=torch.bfloat16)

    errors = (RuntimeError, NotImplementedError, TypeError)  # not built for this device
    return [
        _time_kernel(
            {"groups": groups, "rows": rows, "n": n, "k": k},
            partial(make, groups, rows, n, k),
            2 * groups * rows * n * k,
            timed,
            repeats,
            errors,
        )
        for groups, rows, n, k in shapes
    ]


def _measure_expert_loop(device, dtype, shapes, repeats, timed) -> list[dict[str, Any]]:
    """Each shape's experts three ways, GPU time only: one ``torch._grouped_mm``; one
    GEMM per expert round-robin over :data:`EXPERT_STREAMS` streams (as Transformer
    Engine's GroupedLinear issues them), and the same loop on one stream, both captured
    in a CUDA graph and replayed so the host's launches do not count."""
    import torch

    if device != "cuda":
        return []
    grouped_mm = getattr(torch, "_grouped_mm", None)

    def graphed(groups, m, n, k, streams):
        a = [torch.randn(m, k, device=device, dtype=dtype) for _ in range(groups)]
        b = [torch.randn(k, n, device=device, dtype=dtype) for _ in range(groups)]
        out = [torch.empty(m, n, device=device, dtype=dtype) for _ in range(groups)]
        side = [torch.cuda.Stream() for _ in range(streams)]

        def body():
            main = torch.cuda.current_stream()
            for stream in side:
                stream.wait_stream(main)
            for index in range(groups):
                with torch.cuda.stream(side[index % streams]):
                    torch.mm(a[index], b[index], out=out[index])
            for stream in side:
                main.wait_stream(stream)

        body()  # warm cuBLAS's handles and workspaces outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        return graph.replay

    def grouped(groups, m, n, k):
        if grouped_mm is None:
            raise RuntimeError("this torch has no torch._grouped_mm")
        offs = torch.arange(1, groups + 1, device=device, dtype=torch.int32) * m
        a = torch.randn(groups * m, k, device=device, dtype=dtype)
        b = torch.randn(groups, n, k, device=device, dtype=dtype).transpose(-2, -1)
        return lambda: grouped_mm(a, b, offs=offs)

    rows = []
    for groups, m, n, k in shapes:
        flops = 2.0 * groups * m * n * k
        fields = {"groups": groups, "m": m, "n": n, "k": k}
        row = dict(fields)
        for name, make in (
            ("grouped", partial(grouped, groups, m, n, k)),
            ("streams", partial(graphed, groups, m, n, k, EXPERT_STREAMS)),
            ("one_stream", partial(graphed, groups, m, n, k, 1)),
        ):
            timing = _time_kernel({}, make, flops, timed, repeats, (RuntimeError, TypeError))
            row[f"{name}_tflops"] = timing.get("tflops")
            if "error" in timing:
                row[f"{name}_error"] = timing["error"]
        rows.append(row)
    return rows


def _measure_attention(device, dtype, cases, repeats, timed) -> list[dict[str, Any]]:
    """Causal SDPA forward and backward, each backend it can force, for each ``(batch,
    query heads, key/value heads, sequence)`` case, head dimension 128."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    if device != "cuda":
        backends = {"math": SDPBackend.MATH}

    def make(batch, heads, kv_heads, seq, backend):
        def tensor(count):
            shape = (batch, count, seq, HEAD_DIM)
            return torch.randn(shape, device=device, dtype=dtype, requires_grad=True)

        q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
        grad = torch.randn_like(q)
        gqa = {"enable_gqa": True} if kv_heads != heads else {}

        def step():
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
            out.backward(grad)

        return step

    rows = []
    for name, backend in backends.items():
        for batch, heads, kv_heads, seq in cases:
            # FlashAttention's benchmark count: forward 4·b·s²·h·d halved by the causal
            # mask, backward 2.5 times the forward
            flops = 3.5 * 4 * batch * seq * seq * heads * HEAD_DIM / 2
            fields = {"backend": name, "seq": seq, "batch": batch, "heads": heads}
            fields["kv_heads"] = kv_heads
            make_step = partial(make, batch, heads, kv_heads, seq, backend)
            rows.append(_time_kernel(fields, make_step, flops, timed, repeats))
    return rows


def _block_flops(batch, seq, hidden, heads, kv_heads, mlp_flops_per_token) -> float:
    """A block's forward and backward FLOPs: its projections, the causal half of its
    attention, and its MLP (``mlp_flops_per_token`` forward)."""
    tokens = batch * seq
    forward = 2 * tokens * hidden * (2 * heads + 2 * kv_heads) * HEAD_DIM
    forward += 4 * batch * seq * seq * heads * HEAD_DIM / 2 + tokens * mlp_flops_per_token
    return 3 * forward


def _measure_cases(label: str, cases, make, flops_of, timed, repeats) -> list[dict[str, Any]]:
    """One row per case: ``fields, args = case`` timed as ``make(*args)``, each shown as
    it lands (a compile can be slow)."""
    rows = []
    for fields, args in cases:
        row = _time_kernel(
            fields, partial(make, *args), flops_of(fields), timed, repeats, (Exception,)
        )
        print(label, row, flush=True)
        rows.append(row)
    return rows


def _measure_layers(device, dtype, cases, repeats, timed) -> list[dict[str, Any]]:
    """Forward and backward of one block per case (see :data:`LAYER_CASES`)."""
    from benchmarks.torch_blocks import block_step

    keyed = [
        (
            {"name": name, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffn": ffn}
            | {"seq": seq, "batch": batch, "mode": mode},
            (device, dtype, hidden, heads, kv_heads, ffn, seq, batch, mode),
        )
        for name, hidden, heads, kv_heads, ffn, seq, batch, mode in cases
    ]

    def flops(f):
        args = (f["batch"], f["seq"], f["hidden"], f["heads"], f["kv_heads"])
        return _block_flops(*args, 6 * f["hidden"] * f["ffn"])

    return _measure_cases("layer", keyed, block_step, flops, timed, repeats)


def _measure_moe_blocks(device, dtype, cases, repeats, timed) -> list[dict[str, Any]]:
    """Forward and backward of one block with an MoE MLP per case (:data:`MOE_CASES`)."""
    from benchmarks.torch_blocks import moe_block_step

    keyed = [
        (
            {"name": name, "hidden": hidden, "heads": heads, "kv_heads": kv_heads}
            | {"experts": experts, "top_k": top_k, "ffn": ffn, "seq": seq, "batch": batch}
            | {"mode": "eager"},
            (device, dtype, hidden, heads, kv_heads, experts, top_k, ffn, seq, batch),
        )
        for name, hidden, heads, kv_heads, experts, top_k, ffn, seq, batch in cases
    ]

    def flops(f):
        args = (f["batch"], f["seq"], f["hidden"], f["heads"], f["kv_heads"])
        per_token = 6 * f["top_k"] * f["hidden"] * f["ffn"] + 2 * f["hidden"] * f["experts"]
        return _block_flops(*args, per_token)

    return _measure_cases("moe", keyed, moe_block_step, flops, timed, repeats)


def _measure_steps(device, dtype, cases, repeats, timed) -> list[dict[str, Any]]:
    """Whole one-GPU training steps per case (:data:`STEP_CASES`)."""
    from benchmarks.torch_blocks import training_step

    keyed = [
        (
            {"name": name, "hidden": hidden, "heads": heads, "ffn": ffn, "layers": layers}
            | {"vocab": vocab, "seq": seq, "batch": batch, "mode": mode},
            (device, dtype, hidden, heads, ffn, layers, vocab, seq, batch, mode),
        )
        for name, hidden, heads, ffn, layers, vocab, seq, batch, mode in cases
    ]

    def flops(f):
        args = (f["batch"], f["seq"], f["hidden"], f["heads"], f["heads"])
        blocks = f["layers"] * _block_flops(*args, 6 * f["hidden"] * f["ffn"])
        return blocks + 3 * 2 * f["batch"] * f["seq"] * f["hidden"] * f["vocab"]

    return _measure_cases("step", keyed, training_step, flops, timed, repeats)


def _sweep_cases(sequences: list[int], device: str) -> list[tuple[int, int, int, int]]:
    """The sequence sweep as attention cases: 16k tokens a call on a GPU, as the
    published FlashAttention-2 figures run."""
    return [
        (
            max(1, ATTENTION_TOKENS // seq) if device == "cuda" else 1,
            ATTENTION_HEADS,
            ATTENTION_HEADS,
            seq,
        )
        for seq in sequences
    ]


class _Sampler:
    """NVML samples of the SM clock, board power and GPU temperature every 50 ms in a
    thread, while a load runs (none where there is no GPU or no ``pynvml``)."""

    def __init__(self, device: str):
        self.handle = None
        self.samples: list[tuple[float, float, float, float]] = []  # (t, MHz, W, °C)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if device != "cuda":
            return
        try:
            import pynvml
            import torch
        except ImportError:
            return
        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    @property
    def power_limit_w(self) -> float | None:
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3

    def _run(self) -> None:
        nvml, handle = self.nvml, self.handle
        while not self._stop.is_set():
            self.samples.append(
                (
                    time.perf_counter(),
                    nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                    nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                    nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                )
            )
            time.sleep(0.05)

    def __enter__(self) -> _Sampler:
        if self.handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def between(self, began: float, ended: float) -> dict[str, float]:
        """Median clock, power and temperature of the samples in ``[began, ended]``."""
        inside = [s for s in self.samples if began <= s[0] <= ended]
        if not inside:
            return {}
        return {
            "sm_clock_mhz": statistics.median(s[1] for s in inside),
            "power_w": statistics.median(s[2] for s in inside),
            "temperature_c": statistics.median(s[3] for s in inside),
        }


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _load_over_time(
    device: str, fn: Callable[[], Any], flops: float, seconds: float, window: float
) -> dict[str, Any]:
    """``fn`` run back to back for ``seconds`` (after three warm-up calls), its rate in
    windows of about ``window`` seconds with the clock, power and temperature of each."""
    for _ in range(3):
        fn()
    _synchronize(device)
    windows: list[dict[str, float]] = []
    with _Sampler(device) as sampler:
        time.sleep(0.2)  # the idle board's reading before the load
        idle = sampler.between(0.0, time.perf_counter())
        started = began = time.perf_counter()
        calls = 0
        while began - started < seconds:
            calls = 0
            while True:
                fn()
                calls += 1
                if calls % 4 == 0:
                    _synchronize(device)
                    if time.perf_counter() - began >= window:
                        break
            ended = time.perf_counter()
            row = {
                "t": ended - started,
                "calls": calls,
                "tflops": flops * calls / (ended - began) / 1e12,
            }
            windows.append(row | sampler.between(began, ended))
            began = ended
    return {
        "seconds": began - started,
        "power_limit_w": sampler.power_limit_w,
        "idle": idle,
        "windows": windows,
    }


def _settled(windows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The last quarter of a load's windows: its steady state."""
    return windows[len(windows) * 3 // 4 :] or windows


def _clock_under_load(device, dtype, seconds: float) -> dict[str, Any]:
    """SM clock and board power sampled by NVML while 8192³ GEMMs run back to back."""
    import torch

    if device != "cuda":
        return {"error": "no GPU"}
    a = torch.randn(8192, 8192, device=device, dtype=dtype)
    b = torch.randn(8192, 8192, device=device, dtype=dtype)
    run = _load_over_time(device, lambda: a @ b, 2 * 8192**3, seconds, 0.25)
    if not run["windows"] or "sm_clock_mhz" not in run["windows"][0]:
        return {"error": "no pynvml"}
    settled = run["windows"][len(run["windows"]) // 4 :]
    return {
        "seconds": run["seconds"],
        "tflops": statistics.mean(w["tflops"] for w in run["windows"]),
        "sm_clock_mhz_median": statistics.median(w["sm_clock_mhz"] for w in settled),
        "sm_clock_mhz_min": min(w["sm_clock_mhz"] for w in settled),
        "power_w_median": statistics.median(w["power_w"] for w in settled),
        "power_limit_w": run["power_limit_w"],
        "samples": len(run["windows"]),
    }


# Loads held for SUSTAINED_SECONDS each, from a board left idle for COOL_SECONDS before
# each: an 8192³ BF16 GEMM, the one-GPU OLMo 2 1B training step and one Llama-2-7B block
# at micro-batch 2 (fms-fsdp's shape), both eager: how far a training step's rate falls
# from its first fraction of a second (what a short microbenchmark sees) to its steady
# state under the board's power limit.
SUSTAINED_SECONDS = 35.0
COOL_SECONDS = 15.0
SUSTAINED_WINDOW = 0.25


def _sustained_loads(device, dtype, quick: bool) -> list[dict[str, Any]]:
    """Each load of :data:`SUSTAINED_SECONDS` over time (see there)."""
    import torch

    from benchmarks.torch_blocks import block_step, training_step

    size = 256 if quick else 8192
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    step_case = QUICK_STEP_CASES[0] if quick else STEP_CASES[0]
    name, hidden, heads, ffn, layers, vocab, seq, batch, mode = step_case
    step_fields = {"hidden": hidden, "heads": heads, "ffn": ffn, "layers": layers}
    step_fields |= {"vocab": vocab, "seq": seq, "batch": batch}
    step_flops = layers * _block_flops(batch, seq, hidden, heads, heads, 6 * hidden * ffn)
    step_flops += 3 * 2 * batch * seq * hidden * vocab
    block_case = QUICK_LAYER_CASES[0] if quick else LAYER_CASES[4]
    bname, bhidden, bheads, bkv, bffn, bseq, bbatch, bmode = block_case
    block_flops = _block_flops(bbatch, bseq, bhidden, bheads, bkv, 6 * bhidden * bffn)
    loads = [
        ({"load": f"gemm {size}³"}, lambda: lambda: a @ b, 2 * size**3),
        (
            {"load": f"step {name} {mode}"} | step_fields,
            lambda: training_step(
                device, dtype, hidden, heads, ffn, layers, vocab, seq, batch, mode
            ),
            step_flops,
        ),
        (
            {"load": f"block {bname} {bmode} micro-batch {bbatch}"},
            lambda: block_step(device, dtype, bhidden, bheads, bkv, bffn, bseq, bbatch, bmode),
            block_flops,
        ),
    ]
    seconds = 1.0 if quick else SUSTAINED_SECONDS
    rows = []
    for fields, make, flops in loads:
        time.sleep(0.1 if quick else COOL_SECONDS)
        try:
            row = fields | _load_over_time(device, make(), flops, seconds, SUSTAINED_WINDOW)
        except Exception as error:  # a load this device cannot run is reported, not raised
            row = fields | {"error": str(error)[:200]}
        print("sustained", {k: v for k, v in row.items() if k != "windows"}, flush=True)
        rows.append(row)
    return rows


HOST_CALLS = 2000


def _kernels_of(device: str, fn: Callable[[], Any]) -> int | None:
    """How many GPU kernels one call of ``fn`` launches (``torch.profiler``); None on a
    CPU."""
    if device != "cuda":
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _host_costs(device, dtype, quick: bool) -> dict[str, Any]:
    """What the host spends per kernel it issues from eager PyTorch, and on one
    device-to-host synchronisation: the constants of ``simulator/arithmetic/stacks.py``
    (``EAGER_DISPATCH_S``). Each op is tiny (a 1,024-element tensor), so the GPU idles
    and the wall time of issuing ``HOST_CALLS`` of them back to back is the host's: an
    add without autograd, the same op recorded by autograd, one forward-and-backward
    kernel pair of a 3-op chain through autograd, a ``torch.compile``d 3-op chain (one
    fused kernel from Inductor's wrapper), and ``.item()`` after a kernel (the round
    trip a D2H sync costs)."""
    import torch

    calls = 50 if quick else HOST_CALLS
    x = torch.randn(1024, device=device, dtype=dtype)
    w = torch.randn(1024, device=device, dtype=dtype, requires_grad=True)

    def per_call(fn, n: int = calls) -> float:
        for _ in range(10):
            fn()
        _synchronize(device)
        began = time.perf_counter()
        for _ in range(n):
            fn()
        _synchronize(device)
        return (time.perf_counter() - began) / n

    def chain():
        return ((x * w).sigmoid() + 1.0).sum()

    found: dict[str, Any] = {}
    with torch.no_grad():
        found["add_no_grad_s"] = per_call(lambda: x.add(1.0))
    found["add_autograd_s"] = per_call(lambda: w.add(1.0))
    # forward (mul, sigmoid, add, sum: 4 kernels) and backward (about 5 kernels)
    found["chain_forward_backward_s"] = per_call(lambda: chain().backward(), max(10, calls // 4))
    found["chain_kernels"] = _kernels_of(device, lambda: chain().backward())
    if not quick:  # Inductor takes seconds to compile even this
        try:
            compiled = torch.compile(lambda t: (t * 2.0).sigmoid() + 1.0)
            found["compiled_chain_s"] = per_call(lambda: compiled(x))
        except Exception as error:  # no compiler on this machine: reported, not raised
            found["compiled_chain_error"] = str(error)[:200]

    def round_trip():
        x.add(1.0).sum().item()

    found["item_round_trip_s"] = per_call(round_trip, max(10, calls // 4))
    found["blocks"] = _block_issue_times(device, dtype, quick)
    return found


def _block_issue_times(device, dtype, quick: bool) -> list[dict[str, Any]]:
    """For one eager dense block and one torchtitan-style MoE block (forward and
    backward, the shapes of ``LAYER_CASES[4]`` and ``MOE_CASES[0]``): how long the host
    takes to issue it (the call returning, the GPU still busy), how long until the GPU
    is done, and how many kernels it launched. Issue time near the GPU's is a host-bound
    block."""
    from benchmarks.torch_blocks import block_step, moe_block_step

    dense = QUICK_LAYER_CASES[0] if quick else LAYER_CASES[4]
    name, hidden, heads, kv, ffn, seq, batch, mode = dense
    moe = QUICK_MOE_CASES[0] if quick else MOE_CASES[0]
    mname, mhidden, mheads, mkv, experts, top_k, mffn, mseq, mbatch = moe
    moe_args = (mhidden, mheads, mkv, experts, top_k, mffn, mseq, mbatch)
    blocks = [
        (
            f"block {name} {mode} micro-batch {batch}",
            lambda: block_step(device, dtype, hidden, heads, kv, ffn, seq, batch, mode),
        ),
        (
            f"moe block {mname} eager micro-batch {mbatch}",
            lambda: moe_block_step(device, dtype, *moe_args),
        ),
        (
            f"moe block {mname} eager micro-batch {mbatch}, counts read on the host",
            lambda: moe_block_step(device, dtype, *moe_args, sync=True),
        ),
    ]
    rows = []
    for label, make in blocks:
        try:
            fn = make()
            for _ in range(3):
                fn()
            issue, done = [], []
            for _ in range(2 if quick else 7):
                _synchronize(device)
                began = time.perf_counter()
                fn()
                issue.append(time.perf_counter() - began)
                _synchronize(device)
                done.append(time.perf_counter() - began)
            row = {"block": label, "issue_s": statistics.median(issue)}
            row |= {"done_s": statistics.median(done), "kernels": _kernels_of(device, fn)}
        except Exception as error:  # a block this device cannot run is reported
            row = {"block": label, "error": str(error)[:200]}
        rows.append(row)
    return rows


SECTIONS = (
    "gemm_bf16",
    "gemm_fp8",
    "wave_bf16",
    "grouped_bf16",
    "grouped_fp8",
    "expert_loop",
    "attention_bf16",
    "attention_cases",
    "clock_under_gemm",
    "layer_bf16",
    "step_bf16",
    "moe_layer_bf16",
    "sustained",
    "host",
)


def measure(
    out: Path, quick: bool, repeats: int, only: tuple[str, ...] = SECTIONS
) -> dict[str, Any]:
    """Measure the ``only`` sections (all by default) and write them to ``out``."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    timed = _timer(device)
    gemms = QUICK_GEMM_SHAPES if quick else GEMM_SHAPES
    grouped = QUICK_GROUPED_SHAPES if quick else GROUPED_SHAPES
    sweep = _sweep_cases(QUICK_ATTENTION_SEQUENCES if quick else ATTENTION_SEQUENCES, device)
    sections = {
        "gemm_bf16": lambda: _measure_gemms(device, dtype, gemms, repeats, timed),
        "gemm_fp8": lambda: _measure_fp8_gemms(device, gemms, repeats, timed),
        "wave_bf16": lambda: _measure_gemms(
            device, dtype, QUICK_GEMM_SHAPES if quick else WAVE_SHAPES, repeats, timed
        ),
        "grouped_bf16": lambda: _measure_grouped(device, dtype, grouped, repeats, timed),
        "grouped_fp8": lambda: _measure_grouped(device, dtype, grouped, repeats, timed, fp8=True),
        "expert_loop": lambda: _measure_expert_loop(
            device,
            dtype,
            QUICK_EXPERT_LOOP_SHAPES if quick else EXPERT_LOOP_SHAPES,
            repeats,
            timed,
        ),
        "attention_bf16": lambda: _measure_attention(device, dtype, sweep, repeats, timed),
        "attention_cases": lambda: _measure_attention(
            device, dtype, QUICK_ATTENTION_CASES if quick else ATTENTION_CASES, repeats, timed
        ),
        "clock_under_gemm": lambda: _clock_under_load(device, dtype, 1.0 if quick else 20.0),
        "layer_bf16": lambda: _measure_layers(
            device, dtype, QUICK_LAYER_CASES if quick else LAYER_CASES, repeats, timed
        ),
        "step_bf16": lambda: _measure_steps(
            device, dtype, QUICK_STEP_CASES if quick else STEP_CASES, repeats, timed
        ),
        "moe_layer_bf16": lambda: _measure_moe_blocks(
            device, dtype, QUICK_MOE_CASES if quick else MOE_CASES, repeats, timed
        ),
        "sustained": lambda: _sustained_loads(device, dtype, quick),
        "host": lambda: _host_costs(device, dtype, quick),
    }
    found: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device == "cuda" else None,
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count
        if device == "cuda"
        else None,
        "date": time.strftime("%Y-%m-%d"),
    }
    for name in only:
        found[name] = sections[name]()
    out.write_text(json.dumps(found, indent=1) + "\n")
    return found


def compare(found: dict[str, Any], preset: str) -> list[str]:
    """Markdown tables: each measured kernel beside the rate the preset's compute model
    (:class:`~simulator.engine.compute.ComputeModel`, at ``sustained_fraction`` 1: these
    are microbenchmark rates) gives the same op."""
    from simulator.common.errors import ScenarioError
    from simulator.engine.compute import ComputeModel
    from simulator.schedule.ir import Compute
    from topologies.build import load_cluster_spec

    spec = load_cluster_spec({"preset": preset, "nodes": 1, "gpu": {"sustained_fraction": 1.0}})
    gpu = spec.gpu
    models: dict[str, ComputeModel | None] = {}

    def rate(op: Compute, backend: str = "auto") -> float | None:
        """The model's TFLOP/s for ``op`` (an attention op's causal half, as counted)."""
        if backend not in models:
            try:
                models[backend] = ComputeModel(spec, {"attention_backend": backend})
            except ScenarioError:  # no table of that kernel on this GPU
                models[backend] = None
        model = models[backend]
        if model is None:
            return None
        counted = op.flops * (0.5 if op.kind == "attention" else 1.0)
        return counted / model.compute_seconds(op) / 1e12

    def gemm(row, fp8):
        m, n, k = row["m"], row["n"], row["k"]
        return Compute(0, "compute", 2.0 * m * n * k, 0.0, "gemm", shape=(m, n, k), fp8=fp8)

    lines = [f"{found['device']}, torch {found['torch']}, beside preset {preset}", ""]
    for key, title, fp8 in (
        ("gemm_bf16", "BF16 GEMM", False),
        ("gemm_fp8", "FP8 GEMM", True),
        ("wave_bf16", "BF16 GEMM, n across waves", False),
    ):
        if not found.get(key) or (fp8 and gpu.fp8_peak_flops is None):
            continue
        lines += [
            f"| {title} m×n×k | measured TFLOP/s | model TFLOP/s | model / measured |",
            "|---|---|---|---|",
        ]
        for row in found[key]:
            label = f"{row['m']}×{row['n']}×{row['k']}"
            lines.append(_row(label, row, lambda row=row, fp8=fp8: rate(gemm(row, fp8))))
        lines += [_geomean(found[key], lambda row, fp8=fp8: rate(gemm(row, fp8))), ""]

    def grouped(row, fp8):
        flops = 2.0 * row["groups"] * row["rows"] * row["n"] * row["k"]
        shape = (row["rows"], row["n"], row["k"])
        return Compute(
            0, "compute", flops, 0.0, "grouped_gemm", shape=shape, batch=row["groups"], fp8=fp8
        )

    for key, title, fp8 in (("grouped_bf16", "BF16", False), ("grouped_fp8", "FP8", True)):
        if not found.get(key) or (fp8 and gpu.fp8_peak_flops is None):
            continue
        lines += [
            f"| grouped {title}: groups × rows, n×k | measured TFLOP/s | model TFLOP/s "
            "| model / measured |",
            "|---|---|---|---|",
        ]
        for row in found[key]:
            label = f"{row['groups']} × {row['rows']}, {row['n']}×{row['k']}"
            lines.append(_row(label, row, lambda row=row, fp8=fp8: rate(grouped(row, fp8))))
        lines.append("")

    lines += _expert_loop_lines(found.get("expert_loop", []), spec)

    def attention(row):
        batch = row.get("batch", 1) * row.get("heads", ATTENTION_HEADS)
        seq = row["seq"]
        flops = 4.0 * batch * seq * seq * HEAD_DIM
        return Compute(
            0, "compute", flops, 0.0, "attention", shape=(seq, seq, HEAD_DIM), batch=batch
        )

    # the sweep against the standalone FlashAttention-2's figures; the runs' shapes
    # against the tables the model uses (SDPA's flash backend as measured in the sweep)
    for key, names in (
        ("attention_bf16", {"flash": "fa2"}),
        ("attention_cases", {"flash": "sdpa"}),
    ):
        if not found.get(key):
            continue
        lines += [
            "| attention: backend (table), batch × heads/KV heads × sequence "
            "| measured TFLOP/s | model TFLOP/s | model / measured |",
            "|---|---|---|---|",
        ]
        for row in found[key]:
            heads = f"{row.get('heads', ATTENTION_HEADS)}/{row.get('kv_heads', ATTENTION_HEADS)}"
            table = names.get(row["backend"], row["backend"])
            label = f"{row['backend']} ({table}), {row.get('batch', 1)} × {heads} × {row['seq']}"
            lines.append(_row(label, row, lambda row=row, table=table: rate(attention(row), table)))
        lines.append("")
    for key, title, seconds in (
        ("layer_bf16", "one block, forward and backward", _layer_seconds),
        ("step_bf16", "one-GPU training step", _step_seconds),
        ("moe_layer_bf16", "one MoE block, forward and backward", _layer_seconds),
    ):
        if not found.get(key):
            continue
        lines += [
            f"| {title} | measured ms | model ms | model / measured "
            "| model at sustained_fraction 1, ms | / measured |",
            "|---|---|---|---|---|---|",
        ]
        for row in found[key]:
            label = f"{row['name']}, {row['mode']}, micro-batch {row['batch']}"
            if "error" in row:
                lines.append(f"| {label} | failed: {row['error'][:80]} | | | | |")
                continue
            modelled = seconds(row, preset), seconds(row, preset, sustained=1.0)
            measured = row["seconds"]
            lines.append(
                f"| {label} | {measured * 1e3:.2f} | {modelled[0] * 1e3:.2f} "
                f"| {modelled[0] / measured:.2f} | {modelled[1] * 1e3:.2f} "
                f"| {modelled[1] / measured:.2f} |"
            )
        lines.append("")
    lines += _sustained_lines(found.get("sustained", []))
    lines += _host_lines(found.get("host", {}))
    clock = found.get("clock_under_gemm", {})
    if "sm_clock_mhz_median" in clock:
        lines += [
            "",
            f"8192³ GEMMs for {clock['seconds']:.0f} s: {clock['tflops']:.0f} TFLOP/s, "
            f"SM clock median {clock['sm_clock_mhz_median']:.0f} MHz "
            f"(min {clock['sm_clock_mhz_min']:.0f}), board power {clock['power_w_median']:.0f} W "
            f"of a {clock['power_limit_w']:.0f} W limit; the preset's sustained clock "
            f"{gpu.sustained_clock_hz / 1e6:.0f} MHz, boost {gpu.boost_clock_hz / 1e6:.0f} MHz",
        ]
    return lines


def _expert_loop_lines(rows: list[dict[str, Any]], spec) -> list[str]:
    """The experts as one grouped kernel and as Transformer Engine's loop (a GEMM per
    expert over :data:`EXPERT_STREAMS` streams, and on one), measured, beside the
    model of each (``expert_streams`` 0 and 4, at ``sustained_fraction`` 1)."""
    from simulator.engine.compute import ComputeModel
    from simulator.schedule.ir import Compute

    if not rows:
        return []
    models = {s: ComputeModel(spec, {"expert_streams": s}) for s in (0, EXPERT_STREAMS)}

    def modelled(row, streams: int) -> float:
        flops = 2.0 * row["groups"] * row["m"] * row["n"] * row["k"]
        op = Compute(
            0,
            "compute",
            flops,
            0.0,
            "grouped_gemm",
            shape=(row["m"], row["n"], row["k"]),
            batch=row["groups"],
        )
        return flops / models[streams].compute_seconds(op) / 1e12

    def shown(value: float | None) -> str:
        return "failed" if value is None else f"{value:.0f}"

    lines = [
        "| experts × m×n×k | grouped kernel, measured | model | loop on "
        f"{EXPERT_STREAMS} streams, measured | model | model / measured | one stream, "
        "measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        loop, grouped = row.get("streams_tflops"), row.get("grouped_tflops")
        ratio = "" if loop is None else f"{modelled(row, EXPERT_STREAMS) / loop:.2f}"
        lines.append(
            f"| {row['groups']} × {row['m']}×{row['n']}×{row['k']} | {shown(grouped)} "
            f"| {modelled(row, 0):.0f} | {shown(loop)} | {modelled(row, EXPERT_STREAMS):.0f} "
            f"| {ratio} | {shown(row.get('one_stream_tflops'))} |"
        )
    return [*lines, ""]


def _sustained_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A table of the sustained loads: each one's rate in its first window, at its best
    and in its steady state (the last quarter), with the clock and power there."""
    if not rows:
        return []
    lines = [
        "| load held | first window TFLOP/s | best | steady state | steady / best "
        "| SM clock first → steady, MHz | board power, steady |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        windows = row.get("windows") or []
        if not windows:
            lines.append(f"| {row['load']} | failed: {row.get('error', 'no windows')[:80]} |||||")
            continue
        settled = _settled(windows)
        steady = statistics.median(w["tflops"] for w in settled)
        best = max(w["tflops"] for w in windows)
        clock = power = "n/a"
        if "sm_clock_mhz" in windows[0]:
            first_clock = windows[0]["sm_clock_mhz"]
            clock = (
                f"{first_clock:.0f} → {statistics.median(w['sm_clock_mhz'] for w in settled):.0f}"
            )
            power = f"{statistics.median(w['power_w'] for w in settled):.0f} W"
        lines.append(
            f"| {row['load']} | {windows[0]['tflops']:.0f} | {best:.0f} | {steady:.0f} "
            f"| {steady / best:.3f} | {clock} | {power} |"
        )
    return [*lines, ""]


def _host_lines(host: dict[str, Any]) -> list[str]:
    """The host's cost per issued kernel and per synchronisation, beside the stacks'."""
    if "add_autograd_s" not in host:
        return []
    from simulator.arithmetic.stacks import COMPILED_DISPATCH_S, EAGER_DISPATCH_S

    kernels = host.get("chain_kernels")
    chain = host["chain_forward_backward_s"]
    per = f", {chain / kernels * 1e6:.1f} µs a kernel" if kernels else ""
    compiled = host.get("compiled_chain_s")
    return [
        "| host, per call | µs |",
        "|---|---|",
        f"| a small op, no autograd | {host['add_no_grad_s'] * 1e6:.1f} |",
        f"| the same op recorded by autograd | {host['add_autograd_s'] * 1e6:.1f} |",
        f"| a 3-op chain forward and backward ({kernels} kernels{per}) | {chain * 1e6:.1f} |",
        f"| a compiled 3-op chain (one kernel) | "
        f"{'n/a' if compiled is None else f'{compiled * 1e6:.1f}'} |",
        f"| `.item()` after a kernel (a D2H round trip) | {host['item_round_trip_s'] * 1e6:.1f} |",
        "",
        *_block_issue_lines(host.get("blocks", [])),
        f"The stacks' host dispatch per kernel: eager {EAGER_DISPATCH_S * 1e6:.0f} µs, "
        f"compiled {COMPILED_DISPATCH_S * 1e6:.0f} µs (simulator/arithmetic/stacks.py).",
        "",
    ]


def _block_issue_lines(blocks: list[dict[str, Any]]) -> list[str]:
    """A table of the blocks' host issue time beside their GPU time."""
    rows = [b for b in blocks if "error" not in b]
    if not rows:
        return []
    lines = [
        "| one block, forward and backward | kernels | host issues it, ms | GPU done, ms "
        "| host µs a kernel |",
        "|---|---|---|---|---|",
    ]
    for b in rows:
        per = f"{b['issue_s'] / b['kernels'] * 1e6:.0f}" if b.get("kernels") else "n/a"
        lines.append(
            f"| {b['block']} | {b.get('kernels')} | {b['issue_s'] * 1e3:.2f} "
            f"| {b['done_s'] * 1e3:.2f} | {per} |"
        )
    return [*lines, ""]


def _one_gpu_scenario(row: dict[str, Any], preset: str, sustained: float | None) -> Any:
    """A one-GPU torchtitan scenario of a measured block's or step's shape (eager or
    compiled, bf16 parameters and AdamW moments for a step); ``sustained`` replaces the
    preset's ``sustained_fraction`` (1: the microbenchmark rates alone)."""
    from simulator.request.scenario import scenario_from_dict

    cluster: dict[str, Any] = {"preset": preset, "nodes": 1, "gpus_per_node": 1}
    cluster["nic"] = {"per_node": 1}
    if sustained is not None:
        cluster["gpu"] = {"sustained_fraction": sustained}
    model: dict[str, Any] = {"layers": row.get("layers", 4), "hidden": row["hidden"]}
    model |= {"heads": row["heads"], "head_dim": HEAD_DIM}
    if "experts" in row:  # the recipes' forced balance: uniform routing
        routing = {"kind": "uniform"}
        model["moe"] = {"experts": row["experts"], "top_k": row["top_k"]}
        model["moe"] |= {"expert_ffn_hidden": row["ffn"], "routing": routing}
    model |= {"kv_heads": row.get("kv_heads", row["heads"])}
    model["ffn_hidden"] = row["ffn"] if "experts" not in row else 4 * row["hidden"]
    model |= {"seq_len": row["seq"], "vocab": row.get("vocab", 32000), "mlp": "swiglu"}
    model |= {"norm": "rmsnorm", "position": "rope", "bias": False}
    model |= {"tie_embeddings": False, "dropout": False}
    training = {"global_batch": row["batch"], "micro_batch": row["batch"]}
    training |= {"recompute": "none", "sharding": "none", "framework": "torchtitan"}
    training |= {"optimizer_dtype": "bf16", "master_weights": False}
    training["compile"] = row["mode"] == "compile"
    # the kernel that ran: PyTorch 2.11 with cuDNN 9.19 sends SDPA to cuDNN by default
    # (the profile of the MoE block, benchmarks/measurements/moe-block-profile.txt, shows
    # cudnn_generated_..._sdpa_sm90_flash_* kernels), not to its flash backend
    training["attention_backend"] = "cudnn"
    raw = {"name": "kernel-sweep", "cluster": cluster, "model": model, "training": training}
    raw["parallel"] = {"tp": 1, "pp": 1, "dp": 1}
    return scenario_from_dict(raw, source="kernel_sweep")


def _layer_seconds(row: dict[str, Any], preset: str, sustained: float | None = None) -> float:
    """The model's seconds for one block's forward and backward as the row ran it: its
    one-GPU scenario's second layer's compute ops summed."""
    from simulator.engine.compute import ComputeModel
    from simulator.run.simulate import per_rank_schedule

    scenario = _one_gpu_scenario(row, preset, sustained)
    schedule = per_rank_schedule(scenario)
    compute = ComputeModel(scenario.cluster_spec, schedule.meta)
    ops = schedule.programs[0].ops
    return sum(
        compute.duration(op) for op in ops if op.type == "compute" and op.label.startswith("L1.")
    )


def _step_seconds(row: dict[str, Any], preset: str, sustained: float | None = None) -> float:
    """The model's step time for a measured one-GPU training step."""
    from simulator.run.simulate import run_scenario

    return run_scenario(_one_gpu_scenario(row, preset, sustained)).result.step_time_s


def _geomean(rows, rate_of: Callable[[dict[str, Any]], float | None]) -> str:
    """The geometric mean of model / measured over ``rows``, its mean |log| and worst."""
    logs = [math.log(rate_of(r) / r["tflops"]) for r in rows if "error" not in r]
    if not logs:
        return ""
    worst = max(logs, key=abs)
    return (
        f"\nover {len(logs)} shapes: model / measured {math.exp(statistics.mean(logs)):.3f} "
        "on geometric mean, "
        f"mean |log| {statistics.mean(abs(x) for x in logs):.3f}, worst {math.exp(worst):.2f}"
    )


def _row(label: str, row: dict[str, Any], model: Callable[[], float | None]) -> str:
    """A table row: the measured rate, the model's (``model()``) and their ratio."""
    if "error" in row:
        return f"| {label} | failed: {row['error'][:80]} | | |"
    measured, modelled = row["tflops"], model()
    if modelled is None:
        return f"| {label} | {measured:.0f} | no table | |"
    return f"| {label} | {measured:.0f} | {modelled:.0f} | {modelled / measured:.2f} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kernel_sweep", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    measuring = commands.add_parser("measure")
    measuring.add_argument("--out", type=Path, required=True)
    measuring.add_argument("--quick", action="store_true")
    measuring.add_argument("--repeats", type=int, default=10)
    measuring.add_argument(
        "--only", nargs="+", choices=SECTIONS, default=SECTIONS, help="the sections to measure"
    )
    comparing = commands.add_parser("compare")
    comparing.add_argument("measured", type=Path)
    comparing.add_argument("--preset", required=True)
    args = parser.parse_args(argv)
    if args.command == "measure":
        found = measure(args.out, args.quick, args.repeats, tuple(args.only))
        print(json.dumps({k: v for k, v in found.items() if not isinstance(v, list)}))
        for key in args.only:
            for row in found[key] if isinstance(found[key], list) else []:
                print(key, row)
        return 0
    print("\n".join(compare(json.loads(args.measured.read_text()), args.preset)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
