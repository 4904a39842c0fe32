"""The software stack as part of a run: each framework's kernels for one layer, and the
host-bound regime where dispatch, not FLOPs, sets the step time."""

from __future__ import annotations

import pytest

from simulator.arithmetic.layer_ops import backward_of, layer_forward_ops, loss_op
from simulator.arithmetic.stacks import (
    COMPILED_DISPATCH_S,
    EAGER_DISPATCH_S,
    EAGER_RMSNORM,
    HF_ROPE,
    TITAN_ROPE,
    restack,
    stack_of,
)
from simulator.common.errors import ScenarioError
from simulator.common.vocabulary import FRAMEWORKS
from simulator.request.model import ModelSpec
from simulator.request.scenario import scenario_from_dict
from simulator.run.simulate import run_scenario

LLAMA = ModelSpec(
    name="llama-like",
    layers=2,
    hidden=4096,
    heads=32,
    seq_len=4096,
    vocab=32000,
    ffn_hidden=11008,
    mlp="swiglu",
    norm="rmsnorm",
    position="rope",
    bias=False,
    dropout=False,
)


def _ops(framework: str, compiled: bool = False):
    return layer_forward_ops(LLAMA, 1, 1, stack=stack_of(framework, compiled))


def _by_name(ops):
    return {op.name: op for op in ops}


def test_megatron_is_the_fused_layer_unchanged():
    assert _ops("megatron") == layer_forward_ops(LLAMA, 1, 1)
    assert all(op.kernels == 1 for op in _ops("megatron"))


@pytest.mark.parametrize("framework", ["torchtitan", "fsdp1", "deepspeed"])
def test_eager_pytorch_runs_each_chain_as_several_kernels(framework):
    fused, eager = _by_name(_ops("megatron")), _by_name(_ops(framework))
    tokens = LLAMA.seq_len
    elements = tokens * LLAMA.hidden
    # RMSNorm: 7 kernels moving 36 B per element forward, 10 kernels and 64 B backward,
    # against the fused kernel's 4 B and 6 B
    norm = eager["ln1"]
    assert (norm.kernels, norm.backward_kernels) == (7, 10)
    assert norm.bytes == pytest.approx(EAGER_RMSNORM.forward_bytes * elements)
    assert norm.bytes == pytest.approx(9 * fused["ln1"].bytes)
    (norm_bwd,) = backward_of(norm)
    assert norm_bwd.kernels == 10 and norm_bwd.bytes == pytest.approx(64.0 * elements)
    assert norm.saved_bytes == pytest.approx(3 * fused["ln1"].saved_bytes)
    # the rotary embedding: torchtitan's complex product, or Hugging Face's rotate_half
    rope = HF_ROPE if framework != "torchtitan" else TITAN_ROPE
    qk = fused["rope"].bytes / 4.0
    assert eager["rope"].kernels == rope.forward
    assert eager["rope"].bytes == pytest.approx(rope.forward_bytes * qk)
    # SwiGLU: silu and a multiply, saving gate, up and silu(gate)
    swiglu = eager["swiglu"]
    width = tokens * LLAMA.ffn
    assert (swiglu.kernels, swiglu.backward_kernels) == (2, 3)
    assert swiglu.bytes == pytest.approx(10.0 * width)
    assert swiglu.saved_bytes == pytest.approx(6.0 * width)
    # separate Q, K, V and gate, up projections: same FLOPs, more kernels
    assert eager["qkv"].flops == fused["qkv"].flops and eager["qkv"].kernels == 3
    assert eager["fc1"].flops == fused["fc1"].flops and eager["fc1"].kernels == 2
    assert all(g.kernels == 3 for g in backward_of(eager["qkv"]))
    # the GEMMs and the attention core are the same math
    for name in ("qkv", "attn_core", "proj", "fc1", "fc2"):
        assert eager[name].flops == fused[name].flops


@pytest.mark.parametrize("framework", ["torchtitan", "fsdp1", "deepspeed"])
def test_compile_fuses_each_chain_back_into_one_kernel(framework):
    fused, compiled = _ops("megatron"), _ops(framework, compiled=True)
    for a, b in zip(fused, compiled, strict=True):
        assert a.name == b.name and a.bytes == b.bytes and a.saved_bytes == b.saved_bytes
        if a.kind == "elementwise":
            assert b.kernels == 1
    eager_kernels = sum(op.kernels for op in _ops(framework))
    compiled_kernels = sum(op.kernels for op in compiled)
    assert eager_kernels > compiled_kernels + 10


def test_the_eager_loss_is_a_cross_entropy_on_fp32_logits():
    loss = loss_op(LLAMA, 1, 1)
    (eager,) = restack([loss], stack_of("torchtitan"))
    logits = LLAMA.seq_len * LLAMA.vocab
    assert eager.bytes == pytest.approx(18.0 * logits)
    assert eager.saved_bytes == pytest.approx(4.0 * logits)
    assert (eager.kernels, eager.backward_kernels) == (3, 3)
    # the stacks compile their blocks, not the loss: compiled or not, the same chain
    assert restack([loss], stack_of("torchtitan", compiled=True)) == [eager]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_loss_kernels_follow_training_cross_entropy(framework):
    loss = loss_op(LLAMA, 1, 1)
    logits = LLAMA.seq_len * LLAMA.vocab
    (fused,) = restack([loss], stack_of(framework, cross_entropy="fused"))
    (te,) = restack([loss], stack_of(framework, cross_entropy="te"))
    # one fused kernel pair: two reads of the bf16 logits forward, a read and a write
    # backward, the bf16 logits kept rather than an fp32 copy; TE's keeps its fp32
    # gradient from the forward
    assert fused.bytes == pytest.approx(4.0 * logits)
    assert fused.saved_bytes == pytest.approx(2.0 * logits)
    (fused_bwd,) = backward_of(fused)
    assert fused_bwd.bytes == pytest.approx(4.0 * logits) and fused_bwd.kernels == 1
    assert te.bytes == pytest.approx(8.0 * logits) and te.saved_bytes == pytest.approx(4.0 * logits)
    # on logits the model cast to fp32 (torchtune): the eager cast beside the fused pair,
    # the fp32 logits kept
    (fp32,) = restack([loss], stack_of(framework, cross_entropy="fused-fp32"))
    assert (fp32.kernels, fp32.bytes) == (2, pytest.approx(14.0 * logits))
    assert fp32.saved_bytes == pytest.approx(4.0 * logits)
    # Megatron-LM's own vocabulary-parallel cross-entropy runs six fp32 passes
    if framework == "megatron":
        (own,) = restack([loss], stack_of(framework))
        assert own.bytes == pytest.approx(38.0 * logits)
        assert own.bytes > 9 * fused.bytes


def test_every_framework_has_a_stack_and_a_dispatch_cost():
    for framework in FRAMEWORKS:
        if framework == "megatron":
            assert stack_of(framework).dispatch_s == 0.0
            continue
        assert stack_of(framework).dispatch_s == EAGER_DISPATCH_S
        assert stack_of(framework, True).dispatch_s == COMPILED_DISPATCH_S


def _tiny(hidden: int, framework: str, compile: bool = False) -> dict:
    return {
        "name": "tiny",
        "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 1, "nic": {"per_node": 1}},
        "model": {
            "layers": 4,
            "hidden": hidden,
            "heads": 4,
            "seq_len": 128,
            "vocab": 512,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "position": "rope",
            "bias": False,
            "dropout": False,
        },
        "training": {
            "global_batch": 1,
            "micro_batch": 1,
            "framework": framework,
            "compile": compile,
        },
        "parallel": {"tp": 1, "pp": 1},
        "simulation": {"fidelity": "analytic"},
    }


def _step(spec: dict) -> float:
    return run_scenario(scenario_from_dict(spec, source="test")).result.step_time_s


def test_a_host_bound_step_follows_kernel_count_not_flops():
    # a model this small runs kernels far shorter than the host's 8 us per kernel:
    # four times the FLOPs change the step time by little
    small, large = _step(_tiny(64, "torchtitan")), _step(_tiny(128, "torchtitan"))
    assert large / small < 1.05
    # the same model compiled launches fewer kernels, each cheaper to issue
    compiled = _step(_tiny(128, "torchtitan", compile=True))
    assert compiled < 0.6 * large


def test_a_compute_bound_step_follows_flops():
    spec = _tiny(4096, "torchtitan")
    spec["model"].update(seq_len=4096, heads=32, layers=2)
    big = _step(spec)
    spec["model"]["hidden"] = 2048
    spec["model"]["heads"] = 16
    assert big / _step(spec) > 2.5


def test_megatron_does_not_run_torch_compile():
    spec = _tiny(64, "megatron", compile=True)
    with pytest.raises(ScenarioError, match="training.compile"):
        scenario_from_dict(spec, source="test")
