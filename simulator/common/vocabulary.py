"""The closed sets of names parasim uses, each defined once.

The scenario schema (``Literal`` types), the command line's ``choices``, the sweep's
search space, the step builder's tags and the NCCL tables all derive from these
tuples, so adding a schedule, a recompute mode or an algorithm is one edit here plus
the code that implements it. Orders are meaningful where said.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal, get_args

__all__ = [
    "MlpKind",
    "NormKind",
    "PositionKind",
    "MoeDispatcher",
    "TrainingDtype",
    "RecomputeMode",
    "OptimizerDtype",
    "ShardingLevel",
    "AttentionKernel",
    "AttentionBackend",
    "TpCommOverlap",
    "GradientDtype",
    "Framework",
    "CrossEntropyKernel",
    "CpKind",
    "GridAxis",
    "Fidelity",
    "Algorithm",
    "NcclProtocol",
    "PipelineSchedule",
    "Schedule",
    "PIPELINE_SCHEDULES",
    "PLACEMENT_STYLES",
    "V_SHAPED_SCHEDULES",
    "CHUNKS_PER_RANK",
    "ComputeKind",
    "COMPUTE_KINDS",
    "CollectiveKind",
    "ActionType",
    "FORWARD",
    "FULL_BACKWARD",
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "SEND_F",
    "RECV_F",
    "SEND_B",
    "RECV_B",
    "OVERLAP_F_B",
    "GEMM",
    "ATTENTION",
    "ELEMENTWISE",
    "OPTIMIZER",
    "GROUPED_GEMM",
    "GROUPED_GEMM_WGRAD",
    "ALL_REDUCE",
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "ALL_TO_ALL",
    "BROADCAST",
    "BARRIER",
    "MICROBATCHES_PER_STAGE",
    "SPLIT_BACKWARD_SCHEDULES",
    "SEARCHED_WHEN_FIXED",
    "SCHEDULES",
    "RECOMPUTE_MODES",
    "PHASES",
    "PHASE_OF_PART",
    "PLACEMENT_AXES",
    "GRID_AXES",
    "CP_KINDS",
    "GROUP_AXES",
    "COMM_AXES",
    "COLLECTIVE_KINDS",
    "ALGORITHMS",
    "PROTOCOLS",
    "FIDELITIES",
    "ATTENTION_KERNELS",
    "TP_COMM_OVERLAP",
    "GRADIENT_DTYPES",
    "ATTENTION_BACKENDS",
    "OPTIMIZER_DTYPES",
    "CROSS_ENTROPY_KERNELS",
    "TRAINING_DTYPES",
    "MLP_KINDS",
    "NORM_KINDS",
    "POSITION_KINDS",
    "SHARDING_LEVELS",
    "FRAMEWORKS",
    "MOE_DISPATCHERS",
]

# Pipeline schedules with a built-in order (simulator.schedule.pipeline), and every
# value ``parallel.schedule`` takes (``custom`` reads the order from a CSV file).
PipelineSchedule = Literal[
    "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipev"
]
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
# How a pipeline's global stages sit on its ranks (simulator.request.placement): looped
# (stage s on rank s % p) or V-shaped (the chunks zig-zag over the ranks)
PLACEMENT_STYLES = ("loop", "v")
# The schedules whose two chunks per rank are placed as a V
V_SHAPED_SCHEDULES: tuple[str, ...] = ("zbv", "dualpipev")
# Model chunks per rank of the schedules that place a fixed number (interleaved 1F1B
# takes any, parallel.virtual_stages)
CHUNKS_PER_RANK: dict[str, int] = {"zbv": 2, "dualpipev": 2}
# The schedules that need at least this many micro-batches per pipeline stage
# (DualPipeV: one per stage, as torch's ScheduleDualPipeV requires)
MICROBATCHES_PER_STAGE: dict[str, int] = {"dualpipev": 1}
# The schedules that split the backward into I (input gradients) and deferred W passes
SPLIT_BACKWARD_SCHEDULES = ("zb-h1", "zb-h2", "zbv", "dualpipev")
# The schedules parasim sweep tries only when --fix names them: ZB-H2 holds more
# micro-batches in flight than ZB-H1 for the last of the bubble
SEARCHED_WHEN_FIXED = ("zb-h2",)
Schedule = Literal[PipelineSchedule, "custom"]
SCHEDULES: tuple[str, ...] = (*PIPELINE_SCHEDULES, "custom")

# Activation recompute, lightest first: each one reruns more of the forward.
RecomputeMode = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = get_args(RecomputeMode)

# What part of the step an op belongs to (its ``phase`` tag), in step order.
PHASES = ("fwd", "bwd", "bwd_input", "bwd_weight", "recompute", "optimizer")
# A pipeline action's part (B: whole backward, I: input gradients, W: weight
# gradients) -> the phase of its ops.
PHASE_OF_PART = {"B": "bwd", "I": "bwd_input", "W": "bwd_weight"}

# Axes of the rank grid that ``parallel.placement`` orders, innermost first; context
# parallelism's cp joins them when the sequence is split (GRID_AXES, Megatron-LM's
# order).
PLACEMENT_AXES = ("tp", "dp", "pp")
GridAxis = Literal["tp", "cp", "dp", "pp"]
GRID_AXES: tuple[str, ...] = get_args(GridAxis)
# Context parallelism: K/V blocks passed around a ring (Liu et al., "Ring Attention",
# 2023) or all-to-alls that trade sequence for heads (DeepSpeed-Ulysses, Jacobs et al.,
# 2023).
CpKind = Literal["ring", "ulysses"]
CP_KINDS: tuple[str, ...] = get_args(CpKind)
# Axes of the process groups: the grid's, SP's collectives on the TP group, the expert
# (ep) and expert-data-parallel (edp) groups MoE splits each DP group into, and HSDP's
# shard and replicate groups.
GROUP_AXES = ("tp", "sp", "cp", "dp", "pp", "ep", "edp", "dp_shard", "dp_replicate", "dp_cp")

# Axes a communication op is tagged with (its ``axis``), as the accounting splits exposed
# communication and the reports colour it: expert-data-parallel gradient buckets are
# data-parallel traffic.
COMM_AXES = ("tp", "sp", "cp", "dp", "pp", "ep")


# What a compute op of the Schedule IR runs (``Compute.kind``): a GEMM, the attention
# kernel, an elementwise or normalisation kernel chain, the optimizer's step, and an
# MoE layer's experts as one grouped GEMM (and its weight gradients).
class ComputeKind(StrEnum):
    GEMM = "gemm"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    OPTIMIZER = "optimizer"
    GROUPED_GEMM = "grouped_gemm"
    GROUPED_GEMM_WGRAD = "grouped_gemm_wgrad"


COMPUTE_KINDS: tuple[ComputeKind, ...] = tuple(ComputeKind)


# Collective operations the Schedule IR names (``Collective.kind``).
class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    BARRIER = "barrier"


COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = tuple(CollectiveKind)


# A pipeline action's type, in torch.distributed.pipelining's notation
# (``_ComputationType``): forward, full backward, its input and weight halves, the
# sends and receives between stages, and an overlapped forward and backward.
class ActionType(StrEnum):
    F = "F"
    B = "B"
    I = "I"  # noqa: E741
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    OVERLAP_F_B = "OVERLAP_F_B"


# Every member as a module constant, which the lowering's and the engines' loops use:
# looking a member up on its class goes through EnumType's __getattr__ hook (about
# 60 ns in Python 3.11, against 5 for a global).
FORWARD: Final = ActionType.F
FULL_BACKWARD: Final = ActionType.B
BACKWARD_INPUT: Final = ActionType.I
BACKWARD_WEIGHT: Final = ActionType.W
SEND_F: Final = ActionType.SEND_F
RECV_F: Final = ActionType.RECV_F
SEND_B: Final = ActionType.SEND_B
RECV_B: Final = ActionType.RECV_B
OVERLAP_F_B: Final = ActionType.OVERLAP_F_B
GEMM: Final = ComputeKind.GEMM
ATTENTION: Final = ComputeKind.ATTENTION
ELEMENTWISE: Final = ComputeKind.ELEMENTWISE
OPTIMIZER: Final = ComputeKind.OPTIMIZER
GROUPED_GEMM: Final = ComputeKind.GROUPED_GEMM
GROUPED_GEMM_WGRAD: Final = ComputeKind.GROUPED_GEMM_WGRAD
ALL_REDUCE: Final = CollectiveKind.ALL_REDUCE
ALL_GATHER: Final = CollectiveKind.ALL_GATHER
REDUCE_SCATTER: Final = CollectiveKind.REDUCE_SCATTER
ALL_TO_ALL: Final = CollectiveKind.ALL_TO_ALL
BROADCAST: Final = CollectiveKind.BROADCAST
BARRIER: Final = CollectiveKind.BARRIER

# Each member compares, hashes and prints as its value, so a kind reads and writes as
# the string in JSON, CSV and labels.

# NCCL's algorithms and protocols (src/graph/tuning.cc), as parasim models them.
Algorithm = Literal["ring", "tree", "nvls", "direct", "hierarchical"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
NcclProtocol = Literal["LL", "LL128", "Simple"]
PROTOCOLS: tuple[str, ...] = get_args(NcclProtocol)

# Simulation fidelities: every op alone in closed form, or flows sharing links.
Fidelity = Literal["analytic", "flow"]
FIDELITIES: tuple[str, ...] = get_args(Fidelity)

# Training recipe choices (``training:``).
AttentionKernel = Literal["flash", "unfused"]
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
# The kernel behind ``attention: flash`` (simulator.engine.attention_kernels): the one
# the software stack picks on the GPU, FlashAttention-2, or cuDNN's fused attention.
AttentionBackend = Literal["auto", "fa2", "cudnn", "sdpa"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
TpCommOverlap = Literal["none", "async", "pipelined"]
TP_COMM_OVERLAP: tuple[str, ...] = get_args(TpCommOverlap)
GradientDtype = Literal["fp32", "bf16"]
GRADIENT_DTYPES: tuple[str, ...] = get_args(GradientDtype)
# The dtype of Adam's two moments: fp32 (mixed precision: Megatron-LM, PyTorch AMP and
# FSDP MixedPrecision, DeepSpeed) or bf16 (Megatron-Core's precision-aware optimizer
# with --exp-avg-dtype bf16, Apex DistributedFusedAdam with dtype bf16, pure-bf16
# training such as torchtune's dtype=bf16)
OptimizerDtype = Literal["fp32", "bf16"]
OPTIMIZER_DTYPES: tuple[str, ...] = get_args(OptimizerDtype)
# How the loss runs over the logits (simulator.arithmetic.stacks): the stack's own
# (auto: Megatron-LM's vocabulary-parallel cross-entropy, or F.cross_entropy on fp32
# logits), F.cross_entropy straight on the bf16 logits (eager-bf16: fms-fsdp's LLaMA),
# one fused softmax-cross-entropy kernel pair (fused: Apex's xentropy, torch.compile of
# the loss, Triton kernels), the same on logits the model cast to fp32 before it
# (fused-fp32: torchtune's decoder and compiled loss), or Transformer Engine's (te)
CrossEntropyKernel = Literal["auto", "eager-bf16", "fused", "fused-fp32", "te"]
CROSS_ENTROPY_KERNELS: tuple[str, ...] = get_args(CrossEntropyKernel)
TrainingDtype = Literal["bf16", "fp16", "fp8"]
TRAINING_DTYPES: tuple[str, ...] = get_args(TrainingDtype)
# ZeRO stages by what they shard across data parallelism: nothing, the optimizer
# state (ZeRO-1), also the gradients (ZeRO-2), also the weights (ZeRO-3, FSDP).
ShardingLevel = Literal["none", "optimizer", "gradients", "full"]
SHARDING_LEVELS: tuple[str, ...] = get_args(ShardingLevel)
# The software stacks a run names (``training.framework``), each a set of concrete
# choices read from its code (simulator.arithmetic.stacks): Megatron-Core with
# Transformer Engine, torchtitan (eager PyTorch modules, FSDP2), PyTorch FSDP1 around a
# Hugging Face-style model, and DeepSpeed's ZeRO engine around one. The first is the
# default.
Framework = Literal["megatron", "torchtitan", "fsdp1", "deepspeed"]
FRAMEWORKS: tuple[str, ...] = get_args(Framework)

# How an MoE layer's tokens travel to their experts (``model.moe.dispatcher``):
# ``alltoall`` sends one copy of a token per expert assignment (Megatron-Core's alltoall
# token dispatcher, torchtitan's and DeepSpeed-MoE's all-to-alls), ``deepep`` one per
# destination GPU inside a node and one per destination node across nodes (DeepSeek's
# DeepEP and its hybrid-ep branch, Megatron-Core's flex dispatcher).
MoeDispatcher = Literal["alltoall", "deepep"]
MOE_DISPATCHERS: tuple[str, ...] = get_args(MoeDispatcher)

# Block choices (``model:``).
MlpKind = Literal["gelu", "swiglu"]
MLP_KINDS: tuple[str, ...] = get_args(MlpKind)
NormKind = Literal["layernorm", "rmsnorm"]
NORM_KINDS: tuple[str, ...] = get_args(NormKind)
PositionKind = Literal["learned", "rope"]
POSITION_KINDS: tuple[str, ...] = get_args(PositionKind)

# The modes of ``parasim scale`` (simulator.tools.scale): here, so the parser builds
# without it.
SCALE_MODES = ("weak", "strong")
# How ``parasim sweep --gpus`` and ``parasim scale`` set the global batch at another
# size (simulator.tools.sweep.scaled_batch), the default first; ``scale --mode weak``
# and ``strong`` are the older names of ``per-gpu`` and ``fixed``.
BATCH_POLICIES = ("per-gpu", "fixed", "tokens")
# What ``parasim sweep --objective`` ranks layouts on (simulator.tools.objective): the
# step, or the scenario's whole run trained at the layout; the default first.
OBJECTIVES = ("step", "time-to-train", "cost", "energy")
