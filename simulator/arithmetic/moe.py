"""Mixture-of-experts math: routing, capacity, expert placement, all-to-all traffic
and expert compute.

An MoE layer replaces a transformer layer's dense MLP with ``E`` expert MLPs and a
router. The router sends every token to ``top_k`` distinct experts, so one layer and
one micro-batch of ``T`` tokens make ``k·T`` token-assignments. Mixtral 8x7B (Jiang et
al., "Mixtral of Experts", 2024) has 8 experts, top-2, an MoE layer in every layer;
Switch Transformer (Fedus, Zoph and Shazeer, "Switch Transformers", JMLR 2022, arXiv
2021) routes top-1 and bounds each expert by a *capacity factor* ``f``; GShard
(Lepikhin et al., "GShard", 2020) fixes each expert's capacity per group of ``T``
tokens at ``k·f·T/E`` and drops the assignments over it (the token then skips the
expert through the residual connection). ``capacity_factor: None`` is the dropless
setting (Megatron-Core's default): no limit, nothing dropped.

Expert parallelism splits the experts over an EP group of ``ep`` ranks that are
data-parallel replicas of the dense layers: rank ``j`` holds experts
``[j·E/ep, (j+1)·E/ep)``. Each rank routes its own tokens, sends every assignment to the
rank holding its expert (the *dispatch* all-to-all), the experts run, and the results
travel back (the *combine* all-to-all, the transpose). When routing is skewed the
busiest rank's experts run longest and every other rank waits for it at the combine —
expert parallelism's failure mode. :func:`moe_layer_traffic` gives the per-peer bytes,
the tokens each rank's experts process, the dropped tokens and that imbalance.

Routing is sampled, deterministically from ``(seed, layer, micro-batch)``, from an
*expert popularity* ``p`` (the share of assignments each expert gets):

- ``uniform``: exactly balanced, no sampling — ``k·T // E`` per expert, the remainder
  one each over consecutive experts (from the first; rotated by the source rank in
  :func:`moe_layer_traffic` so that remainders do not pile onto the same experts). It
  is the ideal router and shows zero imbalance.
- ``zipf``: ``p_e ∝ 1/rank_e^exponent``; which expert has rank 1, 2, … is a random
  permutation per layer. ``exponent: 0`` is uniform *popularity*, still sampled, so it
  shows a finite batch's natural fluctuation.
- ``dirichlet``: ``p ~ Dirichlet(concentration·1)`` per layer; small concentrations put
  most tokens on a few experts, large ones approach uniform.
- ``histogram``: ``p`` is a measured per-expert load, normalised; sampled like the
  others, or rounded exactly in proportion (largest remainders) with ``sample: false``.

The popularity of a layer (the zipf permutation, the Dirichlet draw) comes from
``SeedSequence([seed, layer])`` under its own spawn key, so the hot experts of a layer
are the same in every micro-batch and on every source rank (they share one router), and
never share a random stream with a micro-batch's draw. A micro-batch's assignments are
``Multinomial(k·T, p)`` from ``SeedSequence([seed, layer, microbatch])``, with the
source rank appended when several ranks route (each rank's tokens differ).

An expert sees each token at most once, so its load can never exceed ``T``: shares are
capped at ``1/k`` with the excess spread in proportion over the others (water-filling),
and a sampled load over ``T`` spills its excess onto the experts with room. Any loads
summing to ``k·T`` with none over ``T`` are realisable with ``k`` distinct experts per
token, so nothing else is needed to stay physical while sampling only ``E`` counts —
cheap enough for every layer, micro-batch and rank of a sweep.

Expert compute (:func:`expert_ops`) follows :mod:`simulator.request.model`'s conventions: FLOPs
``2mnk`` per GEMM, 2-byte tensors, the local experts as one grouped GEMM that reads
every local expert's weights once. Sizes are in tokens, bytes and FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from simulator.arithmetic.layer_ops import ACT_BYTES, OpCost, activation_op, backward_of
from simulator.common.errors import ScenarioError
from simulator.request.moe import (
    HistogramRouting,
    MoESpec,
    UniformRouting,
    ZipfRouting,
    experts_per_rank,
)

__all__ = [
    "expert_loads",
    "capacity",
    "apply_capacity",
    "expert_ranks",
    "local_experts",
    "MoELayerTraffic",
    "moe_layer_traffic",
    "dispatch_splits",
    "expert_ffn",
    "router_op",
    "expert_ops",
    "shared_expert_ops",
    "expert_backward_of",
    "moe_layer_parameters",
    "moe_layer_parameters_per_rank",
]

# Spawn key that separates a layer's popularity stream from its micro-batch streams.
_POPULARITY_KEY = 0x4D6F45


# ---------------------------------------------------------------------------- routing


def _check_nonnegative(**values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name}({value}) must be >= 0")


def _popularity(spec: MoESpec, seed: int, layer: int) -> np.ndarray:
    """A layer's expert popularity: the share of assignments each expert draws."""
    routing, n = spec.routing, spec.experts
    if isinstance(routing, UniformRouting):
        return np.full(n, 1.0 / n)
    if isinstance(routing, HistogramRouting):
        return np.asarray(routing.loads, dtype=float)
    rng = np.random.default_rng(np.random.SeedSequence([seed, layer], spawn_key=(_POPULARITY_KEY,)))
    if isinstance(routing, ZipfRouting):
        weights = 1.0 / np.arange(1, n + 1, dtype=float) ** routing.exponent
        p = np.empty(n)
        p[rng.permutation(n)] = weights  # expert perm[r] has popularity rank r + 1
    else:
        p = rng.dirichlet(np.full(n, routing.concentration))
    if not np.all(np.isfinite(p)) or p.sum() <= 0:  # a degenerate draw: fall back to even
        p = np.full(n, 1.0 / n)
    return p / p.sum()


def _capped_shares(p: np.ndarray, cap: float) -> np.ndarray:
    """Shares summing to 1 with none above ``cap``: water-filling in proportion to ``p``
    (experts with no popularity take what the others cannot)."""
    shares = np.zeros_like(p, dtype=float)
    free = np.ones(p.size, dtype=bool)
    remaining = 1.0
    while free.any() and remaining > 1e-15:
        idx = np.flatnonzero(free)
        w = p[idx]
        if w.sum() <= 0:
            w = np.ones(idx.size)
        s = remaining * w / w.sum()
        over = s > cap
        if not over.any():
            shares[idx] = s
            break
        shares[idx[over]] = cap
        free[idx[over]] = False
        remaining = 1.0 - shares.sum()
    return shares / shares.sum()


def _spill(
    loads: np.ndarray, limit: int, weights: np.ndarray, rng: np.random.Generator | None
) -> np.ndarray:
    """Clip loads at ``limit`` and move the excess onto experts with room, in proportion
    to ``weights`` (sampled with ``rng``, or to the heaviest weight first without)."""
    loads = loads.copy()
    while True:
        over = loads > limit
        if not over.any():
            return loads
        excess = int((loads[over] - limit).sum())
        loads[over] = limit
        room = loads < limit
        w = np.where(room, weights, 0.0)
        if w.sum() <= 0:
            w = room.astype(float)
        if rng is not None:
            loads += rng.multinomial(excess, w / w.sum())
        else:
            for e in np.argsort(-w, kind="stable"):
                if excess == 0 or not room[e]:
                    break
                take = min(excess, limit - int(loads[e]))
                loads[e] += take
                excess -= take


def _proportional(total: int, shares: np.ndarray) -> np.ndarray:
    """``total`` split in proportion to ``shares`` by largest remainders (ties to the
    lower expert index)."""
    exact = total * shares
    base = np.floor(exact).astype(np.int64)
    rest = total - int(base.sum())
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:rest]] += 1
    return base


def expert_loads(
    spec: MoESpec,
    tokens: int,
    seed: int,
    layer: int,
    microbatch: int,
    *,
    rank: int | None = None,
) -> np.ndarray:
    """Token-assignments each expert receives from ``tokens`` tokens in one MoE layer
    and one micro-batch (``tokens·top_k`` in all, none above ``tokens``), as an int64
    array of length ``experts``. ``rank`` names the source rank when several route
    the same layer and micro-batch; each draws independently."""
    _check_nonnegative(tokens=tokens, seed=seed, layer=layer, microbatch=microbatch)
    n, k = spec.experts, spec.top_k
    total = tokens * k
    if isinstance(spec.routing, UniformRouting):
        base, rest = divmod(total, n)
        loads = np.full(n, base, dtype=np.int64)
        start = 0 if rank is None else (rank * rest) % n
        loads[(start + np.arange(rest)) % n] += 1
        return loads
    shares = _capped_shares(_popularity(spec, seed, layer), 1.0 / k)
    if isinstance(spec.routing, HistogramRouting) and not spec.routing.sample:
        return _spill(_proportional(total, shares), tokens, shares, None)
    entropy = [seed, layer, microbatch] + ([] if rank is None else [rank])
    rng = np.random.default_rng(np.random.SeedSequence(entropy))
    return _spill(rng.multinomial(total, shares).astype(np.int64), tokens, shares, rng)


def capacity(spec: MoESpec, tokens: int) -> int | None:
    """Assignments one expert accepts from a group of ``tokens`` tokens,
    ``ceil(top_k · capacity_factor · tokens / experts)`` (GShard); None when unlimited.
    A capacity of every assignment of the group or more limits nothing: it is that."""
    if spec.capacity_factor is None:
        return None
    exact = spec.top_k * spec.capacity_factor * tokens / spec.experts
    if exact >= spec.top_k * tokens:
        return spec.top_k * tokens
    return math.ceil(round(exact, 9))  # 2·1.1·100/2 is 110, not 111


def apply_capacity(loads: np.ndarray, cap: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per expert: the assignments kept (at most ``cap``) and those dropped."""
    loads = np.asarray(loads, dtype=np.int64)
    if cap is None:
        return loads.copy(), np.zeros_like(loads)
    kept = np.minimum(loads, cap)
    return kept, loads - kept


# -------------------------------------------------------------------------- placement


def expert_ranks(spec: MoESpec, ep: int) -> np.ndarray:
    """The EP rank that holds each expert (length ``experts``)."""
    return np.arange(spec.experts) // experts_per_rank(spec, ep)


def local_experts(spec: MoESpec, ep: int, rank: int) -> range:
    """Experts held by rank ``rank`` of the EP group: ``[rank·E/ep, (rank+1)·E/ep)``."""
    per = experts_per_rank(spec, ep)
    if not 0 <= rank < ep:
        raise ValueError(f"rank({rank}) is outside the EP group of ep({ep}) ranks")
    return range(rank * per, (rank + 1) * per)


# --------------------------------------------------------------------------- traffic


@dataclass(frozen=True, eq=False)
class MoELayerTraffic:
    """One MoE layer, one micro-batch, one EP group. Counts are token-assignments;
    arrays are indexed by EP rank (``expert_tokens`` by expert).

    ``tokens_routed = tokens_sent + tokens_dropped`` per source rank, and
    ``sum(tokens_sent) == sum(tokens_received)``. The diagonal of ``splits`` stays on
    its rank (a local copy in NCCL's all-to-all).
    """

    counts: np.ndarray  # (ep, ep): assignments rank i sends to the experts of rank j
    splits: np.ndarray  # (ep, ep): bytes rank i sends to rank j (dispatch)
    tokens_routed: np.ndarray  # assignments each rank made: its tokens × top_k
    tokens_sent: np.ndarray  # of those, kept (within capacity) and dispatched
    tokens_dropped: np.ndarray  # of those, dropped over capacity
    tokens_received: np.ndarray  # kept assignments each rank's experts process
    expert_tokens: np.ndarray  # kept assignments per expert
    capacity: list[int | None]  # per source rank, per expert
    bytes_per_token: int
    dropped_fraction: float  # sum(dropped) / sum(routed)
    imbalance: float  # max(tokens_received) / mean(tokens_received); 1.0 is balanced

    @property
    def combine_splits(self) -> np.ndarray:
        """Bytes rank i sends to rank j in the combine all-to-all."""
        return self.splits.T


def _tokens_by_rank(tokens_per_rank: int | Sequence[int], ep: int) -> list[int]:
    if isinstance(tokens_per_rank, int | np.integer):
        tokens = [int(tokens_per_rank)] * ep
    else:
        tokens = [int(t) for t in tokens_per_rank]
        if len(tokens) != ep:
            raise ValueError(f"tokens_per_rank has {len(tokens)} entries != ep({ep})")
    for i, t in enumerate(tokens):
        if t < 0:
            raise ValueError(f"tokens_per_rank[{i}]({t}) must be >= 0")
    return tokens


def moe_layer_traffic(
    spec: MoESpec,
    ep: int,
    tokens_per_rank: int | Sequence[int],
    hidden: int,
    bytes_per_element: int,
    seed: int,
    layer: int,
    microbatch: int,
    *,
    group: int = 0,
    nodes: Sequence[int] | None = None,
) -> MoELayerTraffic:
    """Routing, dropping and dispatch traffic of one MoE layer for one micro-batch on
    an EP group of ``ep`` ranks, each routing its own ``tokens_per_rank`` tokens
    (one number for all, or one per rank) of ``hidden`` elements.

    Capacity is enforced per source rank (GShard's group is a rank's tokens; so does
    Megatron-Core), before the dispatch. ``group`` numbers the EP group among the
    ``dp/ep`` groups: source rank ``i`` is sampled as data-parallel replica
    ``group·ep + i``, so different groups route different tokens.

    Node-limited routing (``spec.max_nodes_per_token`` = ``M``, with ``nodes`` giving
    each EP rank's node): as DeepSeek-V3 routes and DeepEP dispatches, a token reaches
    at most ``M`` nodes and crosses to each once, its ``k/M`` assignments there
    forwarded inside the node. A source rank's bytes to a remote node are then its
    tokens bound there, ``assignments · M/k`` (at most its tokens), spread over that
    node's ranks as its assignments are; inside its own node every assignment moves.
    The expert loads are unchanged; the imbalance and drops too.
    """
    per = experts_per_rank(spec, ep)
    tokens = _tokens_by_rank(tokens_per_rank, ep)
    _check_nonnegative(group=group, hidden=hidden, bytes_per_element=bytes_per_element)
    counts = np.zeros((ep, ep), dtype=np.int64)
    dropped = np.zeros(ep, dtype=np.int64)
    expert_tokens = np.zeros(spec.experts, dtype=np.int64)
    caps: list[int | None] = []
    for i, t in enumerate(tokens):
        loads = expert_loads(spec, t, seed, layer, microbatch, rank=group * ep + i)
        cap = capacity(spec, t)
        kept, drop = apply_capacity(loads, cap)
        counts[i] = kept.reshape(ep, per).sum(axis=1)
        dropped[i] = drop.sum()
        expert_tokens += kept
        caps.append(cap)
    routed = np.asarray(tokens, dtype=np.int64) * spec.top_k
    received = counts.sum(axis=0)
    bytes_per_token = hidden * bytes_per_element
    mean = received.mean()
    splits = counts * bytes_per_token
    if spec.max_nodes_per_token is not None and nodes is not None:
        splits = _node_limited_splits(spec, counts, tokens, nodes, bytes_per_token)
    return MoELayerTraffic(
        counts=counts,
        splits=splits,
        tokens_routed=routed,
        tokens_sent=counts.sum(axis=1),
        tokens_dropped=dropped,
        tokens_received=received,
        expert_tokens=expert_tokens,
        capacity=caps,
        bytes_per_token=bytes_per_token,
        dropped_fraction=float(dropped.sum() / routed.sum()) if routed.sum() else 0.0,
        imbalance=float(received.max() / mean) if mean > 0 else 1.0,
    )


def _node_limited_splits(
    spec: MoESpec,
    counts: np.ndarray,
    tokens: list[int],
    nodes: Sequence[int],
    bytes_per_token: int,
) -> np.ndarray:
    """Dispatch bytes when each token reaches at most ``max_nodes_per_token`` nodes and
    crosses to each once (see :func:`moe_layer_traffic`)."""
    node_of = np.asarray(nodes)
    limit = min(int(spec.max_nodes_per_token or 1), len(set(node_of.tolist())))
    per_node = max(1.0, spec.top_k / limit)  # a token's assignments on each node it reaches
    splits = counts.astype(float) * bytes_per_token
    for i, sent in enumerate(counts):
        for node in set(node_of.tolist()) - {int(node_of[i])}:
            there = node_of == node
            assignments = float(sent[there].sum())
            if assignments == 0:
                continue
            crossing = min(float(tokens[i]), assignments / per_node)
            splits[i, there] = sent[there] / assignments * crossing * bytes_per_token
    return splits


def dispatch_splits(
    spec: MoESpec,
    ep: int,
    tokens_per_rank: int | Sequence[int],
    hidden: int,
    bytes_per_element: int,
    seed: int,
    layer: int,
    microbatch: int,
    *,
    group: int = 0,
) -> np.ndarray:
    """Bytes rank i sends to rank j in the dispatch all-to-all, shape ``(ep, ep)``;
    the combine all-to-all is its transpose. See :func:`moe_layer_traffic`."""
    return moe_layer_traffic(
        spec,
        ep,
        tokens_per_rank,
        hidden,
        bytes_per_element,
        seed,
        layer,
        microbatch,
        group=group,
    ).splits


# --------------------------------------------------------------------------- compute


def expert_ffn(spec: MoESpec, model_hidden: int, model_ffn: int | None = None) -> int:
    """An expert's MLP width: ``spec.expert_ffn_hidden`` (or its older name
    ``ffn_hidden``), else the model's (``4h`` by default)."""
    if spec.expert_ffn_hidden is not None:
        return spec.expert_ffn_hidden
    if spec.ffn_hidden is not None:
        return spec.ffn_hidden
    return model_ffn if model_ffn is not None else 4 * model_hidden


def _grouped_gemm(
    name: str,
    m: int,
    n: int,
    k: int,
    groups: int,
    bias: bool,
    weight: str = "b",
    saved: float = 0.0,
) -> OpCost:
    """``groups`` GEMMs sharing ``m`` rows between them, ``(m, k) @ (k, n)`` in all.

    FLOPs as one ``(m, n, k)`` GEMM; HBM traffic reads the activations once and each
    group's ``k×n`` weight once (``weight="b"``), or writes each group's ``m×n`` weight
    gradient (``weight="c"``, a wgrad).
    """
    flops = 2.0 * m * n * k
    if weight == "b":
        elements = m * k + groups * k * n + m * n
    else:
        elements = m * k + k * n + groups * m * n
    params = groups * (n * k + (n if bias else 0))
    return OpCost(
        name, "gemm", flops, ACT_BYTES * elements, flops, (m, n, k), params, saved_bytes=saved
    )


def router_op(spec: MoESpec, model_hidden: int, tokens: int) -> OpCost:
    """The router GEMM ``(tokens, E, h)`` (no bias, as in Switch and Mixtral). Its
    weight is replicated over TP ranks; each runs it on the tokens it holds, and keeps
    its input for the backward."""
    return _grouped_gemm(
        "moe_router",
        tokens,
        spec.experts,
        model_hidden,
        1,
        bias=False,
        saved=ACT_BYTES * tokens * model_hidden,
    )


def expert_ops(
    spec: MoESpec,
    model_hidden: int,
    tokens: int,
    tp: int = 1,
    *,
    ep: int = 1,
    model_ffn: int | None = None,
    router_tokens: int | None = None,
    mlp: str = "gelu",
    bias: bool = True,
) -> list[OpCost]:
    """Forward ops of one MoE layer's router and local experts on one rank.

    ``tokens`` is the assignments the rank's ``E/ep`` experts process (e.g.
    :attr:`MoELayerTraffic.tokens_received`); ``router_tokens`` the rank's own tokens
    that pass the router (default ``ceil(tokens/top_k)``, the balanced case). The expert
    MLPs are ``fc1 (tokens, f/tp, h)`` (SwiGLU: gate and up, ``2f/tp``), the
    activation, ``fc2 (tokens, h, f/tp)`` with the expert width ``f`` split over ``tp``
    as Megatron's dense MLP, the local experts as one grouped GEMM each. The dispatch
    all-to-all falls between ``moe_router`` and ``expert_fc1``, the combine after
    ``expert_fc2``. Activation bytes and saved tensors follow
    :func:`simulator.arithmetic.layer_ops.mlp_forward_ops`.
    """
    _check_nonnegative(tokens=tokens)
    h, f = model_hidden, expert_ffn(spec, model_hidden, model_ffn)
    if f % tp:
        raise ScenarioError(f"model.moe.ffn_hidden: expert ffn({f}) is not divisible by tp({tp})")
    groups = experts_per_rank(spec, ep)
    if router_tokens is None:
        router_tokens = -(-tokens // spec.top_k)
    local = f // tp
    elements = tokens * local
    fc1_width = 2 * local if mlp == "swiglu" else local
    act = activation_op(mlp, elements, prefix="expert_")
    return [
        router_op(spec, h, router_tokens),
        _grouped_gemm(
            "expert_fc1", tokens, fc1_width, h, groups, bias, saved=ACT_BYTES * tokens * h
        ),
        act,
        _grouped_gemm("expert_fc2", tokens, h, local, groups, bias, saved=ACT_BYTES * elements),
    ]


def shared_expert_ops(
    spec: MoESpec,
    model_hidden: int,
    tokens: int,
    tp: int = 1,
    *,
    model_ffn: int | None = None,
    mlp: str = "gelu",
    bias: bool = True,
) -> list[OpCost]:
    """The shared experts of one MoE layer on one rank: one dense MLP of
    ``shared_experts`` times the expert width over the rank's own ``tokens``, split over
    ``tp`` as the model's MLP (``shared_fc1``, its activation, ``shared_fc2``; the TP
    all-reduce after ``shared_fc2``); none when the layer has no shared experts."""
    if not spec.shared_experts:
        return []
    width = expert_ffn(spec, model_hidden, model_ffn) * spec.shared_experts
    if width % tp:
        raise ScenarioError(
            f"model.moe.shared_experts: shared width({width}) is not divisible by tp({tp})"
        )
    h, local = model_hidden, width // tp
    fc1_width = 2 * local if mlp == "swiglu" else local
    return [
        _grouped_gemm("shared_fc1", tokens, fc1_width, h, 1, bias, saved=ACT_BYTES * tokens * h),
        activation_op(mlp, tokens * local, prefix="shared_"),
        _grouped_gemm("shared_fc2", tokens, h, local, 1, bias, saved=ACT_BYTES * tokens * local),
    ]


def expert_backward_of(op: OpCost, local_experts: int = 1) -> list[OpCost]:
    """Backward ops of an op from :func:`expert_ops`: like
    :func:`simulator.request.model.backward_of`, but a grouped expert GEMM's dgrad reads, and
    its wgrad writes, every one of the ``local_experts`` weights."""
    if op.kind != "gemm" or local_experts == 1:
        return backward_of(op)
    assert op.shape is not None
    m, n, k = op.shape
    dgrad = _grouped_gemm(f"{op.name}.dgrad", m, k, n, local_experts, bias=False)
    wgrad = _grouped_gemm(f"{op.name}.wgrad", k, n, m, local_experts, bias=False, weight="c")
    return [replace(dgrad, weight_params=0), replace(wgrad, weight_params=op.weight_params)]


def _expert_parameters(hidden: int, ffn: int, mlp: str, bias: bool) -> int:
    """One expert MLP of width ``ffn`` (on one TP rank: ``ffn/tp``), its matrices and
    the biases a rank holds (``fc1``'s split, ``fc2``'s whole)."""
    if mlp == "swiglu":
        return 3 * hidden * ffn + ((2 * ffn + hidden) if bias else 0)
    return 2 * hidden * ffn + ((ffn + hidden) if bias else 0)


def moe_layer_parameters(
    spec: MoESpec,
    hidden: int,
    model_ffn: int | None = None,
    mlp: str = "gelu",
    bias: bool = True,
) -> int:
    """Parameters replacing one layer's dense MLP: the router (``h·E``) and every
    expert's matrices and biases (GELU: ``E·(2hf + f + h)``; SwiGLU: three matrices)."""
    f = expert_ffn(spec, hidden, model_ffn)
    routed = spec.experts * _expert_parameters(hidden, f, mlp, bias)
    shared = _expert_parameters(hidden, f * spec.shared_experts, mlp, bias)
    return hidden * spec.experts + routed + (shared if spec.shared_experts else 0)


def moe_layer_parameters_per_rank(
    spec: MoESpec,
    hidden: int,
    ep: int,
    tp: int = 1,
    model_ffn: int | None = None,
    mlp: str = "gelu",
    bias: bool = True,
) -> int:
    """One rank's share of :func:`moe_layer_parameters`: the replicated router and its
    ``E/ep`` experts, their matrices and ``fc1`` bias split over ``tp`` (the ``fc2``
    bias replicated, as Megatron's row-parallel linear). Equals the ``weight_params``
    of :func:`expert_ops`."""
    f = expert_ffn(spec, hidden, model_ffn)
    if f % tp:
        raise ScenarioError(f"model.moe.ffn_hidden: expert ffn({f}) is not divisible by tp({tp})")
    local = experts_per_rank(spec, ep)
    count = hidden * spec.experts + local * _expert_parameters(hidden, f // tp, mlp, bias)
    if spec.shared_experts:  # one dense MLP, split over TP like the model's
        count += _expert_parameters(hidden, f * spec.shared_experts // tp, mlp, bias)
    return count
