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
from typing import cast

import numpy as np

from simulator.arithmetic.layer_ops import ACT_BYTES, OpCost, activation_op, backward_of
from simulator.common.errors import ScenarioError
from simulator.common.vocabulary import (
    ELEMENTWISE,
    GEMM,
    GROUPED_GEMM,
    GROUPED_GEMM_WGRAD,
)
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
    "reach_probability",
    "expert_ffn",
    "router_op",
    "expert_ops",
    "shared_expert_ops",
    "expert_backward_of",
    "FP8_ROW_ALIGN",
    "MoEStack",
    "STACKS",
    "stack_of",
    "MoELayerOps",
    "moe_layer_ops",
    "padded_capacity_rows",
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


def loads_equal(spec: MoESpec | None, tokens: int) -> bool:
    """Whether every rank routing ``tokens`` tokens gives every expert the same load,
    so that the ranks of an EP group receive alike: uniform routing whose
    ``tokens·top_k`` assignments divide evenly over the experts (:func:`expert_loads`);
    True without experts (``spec`` None), whose ranks have no loads to differ in."""
    if spec is None:
        return True
    return isinstance(spec.routing, UniformRouting) and tokens * spec.top_k % spec.experts == 0


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
    if spec.dispatcher == "deepep":
        splits = _deepep_splits(spec, counts, tokens, nodes, bytes_per_token)
    elif spec.max_nodes_per_token is not None and nodes is not None:
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


def reach_probability(spec: MoESpec, share: float) -> float:
    """The chance that a token has at least one of its ``top_k`` experts among a set
    holding ``share`` of its router's assignments: ``1 − Π_r (1 − share·E/(E − r))``
    over its ``k`` picks, each without replacement among ``E`` experts. Exact for a
    uniform router (a set of ``e`` experts: ``1 − C(E − e, k)/C(E, k)``); for a skewed
    one it spreads the set's share evenly over its experts."""
    experts, k = spec.experts, spec.top_k
    if share <= 0:
        return 0.0
    missed = 1.0
    for r in range(k):
        missed *= max(0.0, 1.0 - share * experts / (experts - r))
    return 1.0 - missed


def _deepep_splits(
    spec: MoESpec,
    counts: np.ndarray,
    tokens: list[int],
    nodes: Sequence[int] | None,
    bytes_per_token: int,
) -> np.ndarray:
    """Dispatch bytes as DeepEP sends them (DeepSeek's DeepEP, ``Buffer.dispatch``: a
    token goes once to each GPU of its own node that holds one of its experts, its
    top-k indices and weights beside it, and once over RDMA to each other node holding
    one, where NVLink forwards it; the receiving GPU copies it to each local expert).
    Each pair's bytes are the expected tokens that reach it (:func:`reach_probability`
    of the pair's share of the source's assignments); with node-limited routing a token
    crosses to each of its at most ``max_nodes_per_token`` nodes as
    :func:`_node_limited_splits` counts. A node's bytes are spread over its GPUs as the
    source's assignments there are; the NVLink forwarding inside it is not counted."""
    ep = len(counts)
    node_of = np.asarray(nodes) if nodes is not None else np.zeros(ep, dtype=np.int64)
    node_ids = sorted(set(node_of.tolist()))
    limited = spec.max_nodes_per_token is not None and nodes is not None
    if limited:
        assert nodes is not None  # limited says so
        splits = _node_limited_splits(spec, counts, tokens, nodes, bytes_per_token)
    else:
        splits = counts.astype(float) * bytes_per_token
    for i, sent in enumerate(counts):
        if sent.sum() == 0 or tokens[i] == 0:
            continue
        per_source = tokens[i] * spec.top_k  # the source's assignments before drops
        for node in node_ids:
            there = node_of == node
            if node == node_of[i]:  # NVLink: once per GPU
                for j in np.flatnonzero(there):
                    reach = reach_probability(spec, sent[j] / per_source)
                    splits[i, j] = tokens[i] * reach * bytes_per_token
            elif not limited:  # RDMA: once per node
                on_node = float(sent[there].sum())
                if on_node == 0:
                    continue
                crossing = tokens[i] * reach_probability(spec, on_node / per_source)
                splits[i, there] = sent[there] / on_node * crossing * bytes_per_token
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
        name,
        GEMM,
        flops,
        ACT_BYTES * elements,
        flops,
        (m, n, k),
        params,
        saved_bytes=saved,
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
    """Backward ops of an op from :func:`expert_ops` or :func:`moe_layer_ops`: like
    :func:`simulator.request.model.backward_of`, but a grouped expert GEMM's dgrad reads, and
    its wgrad writes, every one of the ``local_experts`` weights. A ``grouped_gemm``
    op's backward is grouped too: the dgrad ``(m, k, n)`` per group and the wgrad, each
    group's ``k × n`` gradient reduced over its ``m`` rows (``grouped_gemm_wgrad``)."""
    if op.kind == GROUPED_GEMM:
        assert op.shape is not None
        m, n, k = op.shape
        g, rows = op.batch, op.flops / (2.0 * n * k) if n * k else 0.0
        real = op.model_flops / (2.0 * n * k) if n * k else 0.0
        dgrad = OpCost(
            f"{op.name}.dgrad",
            GROUPED_GEMM,
            op.flops,
            ACT_BYTES * (rows * n + g * n * k + rows * k),
            op.model_flops,
            (m, k, n),
            0,
            g,
            fp8=op.fp8,
        )
        wgrad = OpCost(
            f"{op.name}.wgrad",
            GROUPED_GEMM_WGRAD,
            op.flops,
            ACT_BYTES * (rows * k + rows * n + g * n * k),
            2.0 * real * n * k,
            (k, n, m),
            op.weight_params,
            g,
            fp8=op.fp8,
        )
        return [dgrad, wgrad]
    if op.kind != GEMM or local_experts == 1:
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


# ------------------------------------------------------- the layer as each stack runs it

#: Rows each expert's input is padded to for FP8 GEMMs: Megatron-LM's
#: ``fp8_utils.get_fp8_align_size`` (16; 32 for MXFP8) used by Transformer Engine's
#: ``Fp8Padding`` in ``TEGroupedMLP`` (megatron/core/transformer/moe/experts.py, commit
#: d98e8a6); torchtitan's ``TorchAOTokenDispatcher`` pads each group to ``pad_multiple``
#: (16 for FP8 rowwise), cuBLASLt's FP8 GEMMs need 16-multiples.
FP8_ROW_ALIGN = 16


@dataclass(frozen=True)
class MoEStack:
    """How one software stack runs an MoE layer (one row of :data:`STACKS`)."""

    grouped_gemm: bool  # the local experts as one grouped GEMM; else a loop, one GEMM each
    fused_permute: bool  # fused permute/unpermute kernels; else eager index ops
    sort_after_dispatch: bool  # received rows re-sorted from (source, expert) to expert order
    fused_gate_up: bool  # SwiGLU's gate and up projections as one GEMM
    aux_loss: bool  # the load-balancing loss, when model.moe.aux_loss does not say
    einsum_dispatch: bool  # dispatch/combine as dense einsums over (tokens, experts x capacity)
    pads_to_capacity: bool  # every expert's input padded to its capacity, always
    # a grouped GEMM's experts as one kernel (0), or one GEMM per expert issued
    # round-robin over this many streams (Transformer Engine's GroupedLinear)
    expert_streams: int = 0


#: The MoE layer of each ``training.framework``, from the code it runs:
#:
#: - ``megatron`` (Megatron-LM commit d98e8a6, megatron/core/transformer/moe/):
#:   ``--moe-grouped-gemm`` (``TEGroupedMLP``: TE ``GroupedLinear``, gate and up in
#:   ``linear_fc1``; TE's ``general_grouped_gemm`` reaches ``nvte_multi_tensor_gemm``,
#:   which issues one cuBLASLt GEMM per local expert round-robin over 4 compute streams:
#:   TransformerEngine d0067d0, ``common/gemm/cublaslt_gemm.cu`` and
#:   ``common/util/multi_stream.cpp``), ``--moe-permute-fusion`` (TE ``moe_permute_with_probs``,
#:   ``moe_unpermute``; ``token_dispatcher.MoEAlltoAllTokenDispatcher``: "Permutation 1"
#:   before the all-to-all, ``sort_chunks_by_idxs`` — "Permutation 2" — after it when a
#:   rank holds several experts, the reverse before the combine), the ``aux_loss``
#:   load balancing its MoE examples set (``--moe-aux-loss-coeff 1e-2``).
#: - ``torchtitan`` (commit b5bcd76, torchtitan/models/common/moe.py and
#:   token_dispatcher.py): ``torch._grouped_mm`` for ``w1``, ``w3`` and ``w2`` separately;
#:   eager ``argsort`` and ``x[idx]`` before the all-to-all, ``_permute`` (an index
#:   gather, rank-major to expert-major) after it, ``_unpermute`` before the combine,
#:   the scores multiplied in fp32 and ``deterministic_scatter_add`` after it;
#:   auxiliary-loss-free balancing (an expert bias, no aux loss).
#: - ``fsdp1`` (HF transformers ``MixtralSparseMoeBlock``): a Python loop over the
#:   experts hit, each ``hidden_states[top_x]``, ``w1``, ``w3``, ``w2`` as separate
#:   ``nn.Linear`` GEMMs, the routing weight multiplied in, ``index_add_`` back;
#:   ``load_balancing_loss_func`` when trained with ``output_router_logits``.
#: - ``deepspeed`` (DeepSpeed-MoE, deepspeed/moe/sharded_moe.py): gating builds dense
#:   ``(tokens, experts, capacity)`` combine weights and dispatch mask, dispatch and
#:   combine are einsums ``"sec,sm->ecm"`` and ``"sec,ecm->sm"`` over them, every expert
#:   runs on its full capacity (``drop_tokens=False``: the busiest expert's load) in a
#:   loop over the local experts (``Experts.forward``), the ``l_aux`` loss always.
STACKS: dict[str, MoEStack] = {
    "megatron": MoEStack(True, True, True, True, True, False, False, expert_streams=4),
    "torchtitan": MoEStack(True, False, True, False, False, False, False),
    "fsdp1": MoEStack(False, False, False, False, True, False, False),
    "deepspeed": MoEStack(False, False, False, False, True, True, True),
}

# Bytes per element (bf16 rows of ``h``) of the token-reordering kernels, forward and
# backward. A gather reads a row and writes it (4); its backward scatters the gradient
# back: fused (TE's unpermute of the gradient) the same 4, eager (``index_add_`` /
# ``index_put_(accumulate=True)``) an atomic read-modify-write of the destination (6).
_GATHER = {True: (4.0, 4.0), False: (4.0, 6.0)}
# The router's softmax/top-k over the fp32 (T, E) logits: reads them, writes the fp32
# probabilities and the routing map (9 B/element); backward reads the gradient and the
# probabilities and writes the logits' gradient (12).
_ROUTER_TOPK = (9.0, 12.0)
# The load-balancing loss (Switch Transformer eq. 4, E·Σ f_e·P_e): reads the (T, E)
# probabilities and the routing map (5 B/element); its backward writes the
# probabilities' gradient (read-add-write of fp32, 8).
_AUX_LOSS = (5.0, 8.0)
# torchtitan's score multiply in fp32: ``(x.to(float32) * s).to(bf16)``, three eager
# kernels (2+4, 4+4, 4+2 B/element), its backward alike.
_SCORE_FP32 = (20.0, 20.0)


@dataclass(frozen=True)
class MoELayerOps:
    """Forward ops of one MoE layer on one rank, in the places the stack runs them:
    ``router`` on the rank's own tokens, ``dispatch`` before the dispatch all-to-all,
    ``received`` after it, ``experts``, ``returned`` before the combine all-to-all and
    ``combine`` after it."""

    router: tuple[OpCost, ...]
    dispatch: tuple[OpCost, ...]
    received: tuple[OpCost, ...]
    experts: tuple[OpCost, ...]
    returned: tuple[OpCost, ...]
    combine: tuple[OpCost, ...]

    @property
    def all(self) -> list[OpCost]:
        return [
            *self.router,
            *self.dispatch,
            *self.received,
            *self.experts,
            *self.returned,
            *self.combine,
        ]


def stack_of(framework: str) -> MoEStack:
    """The :data:`STACKS` row of ``training.framework``."""
    if framework not in STACKS:
        raise ScenarioError(
            f"training.framework: {framework!r} has no MoE layer model (one of {sorted(STACKS)})"
        )
    return STACKS[framework]


def _moved(name: str, elements: float, passes: tuple[float, float], saved: float = 0.0) -> OpCost:
    """A memory-bound kernel over ``elements`` values moving ``passes`` bytes each
    (forward, backward)."""
    forward, backward = passes
    return OpCost(
        name,
        ELEMENTWISE,
        elements,
        forward * elements,
        0.0,
        saved_bytes=saved,
        backward_bytes=backward * elements,
    )


def _fp8_gemm(op: OpCost) -> list[OpCost]:
    """An expert GEMM on FP8 tensor cores, as :func:`~.layer_ops.fp8_ops` runs one:
    a fused cast of its bf16 input before it, its saved input in FP8."""
    assert op.shape is not None
    m, n, k = op.shape
    inputs, grads = float(op.batch * m * k), float(op.batch * m * n)
    cast = OpCost(
        f"{op.name}.cast",
        ELEMENTWISE,
        2 * inputs,
        3 * inputs,
        0.0,
        backward_bytes=3 * grads,
    )
    return [cast, replace(op, fp8=True, saved_bytes=op.saved_bytes / ACT_BYTES)]


def _padded_rows(rows: np.ndarray, capacity_rows: Sequence[int] | None, fp8: bool) -> np.ndarray:
    padded = np.asarray(rows if capacity_rows is None else capacity_rows, dtype=np.int64)
    if fp8:
        padded = -(-padded // FP8_ROW_ALIGN) * FP8_ROW_ALIGN
    return padded


def _grouped(
    name: str, real: int, padded: int, n: int, k: int, groups: int, bias: bool, saved: float
) -> OpCost:
    """``groups`` expert GEMMs ``(rows_e, n, k)`` as one grouped kernel: ``padded`` rows
    computed (shape: their mean per group), ``real`` of them model FLOPs; reads the
    rows and every group's weight once and writes the output."""
    m = -(-padded // groups) if groups else 0
    flops = 2.0 * padded * n * k
    traffic = ACT_BYTES * (padded * k + groups * k * n + padded * n)
    params = groups * (n * k + (n if bias else 0))
    return OpCost(
        name,
        GROUPED_GEMM,
        flops,
        traffic,
        2.0 * real * n * k,
        (m, n, k),
        params,
        groups,
        saved,
    )


def moe_layer_ops(
    spec: MoESpec,
    model_hidden: int,
    expert_rows: Sequence[int] | np.ndarray,
    *,
    tokens: int,
    sent: int,
    tp: int = 1,
    framework: str = "megatron",
    fp8: bool = False,
    compiled: bool = False,
    capacity_rows: Sequence[int] | None = None,
    model_ffn: int | None = None,
    mlp: str = "gelu",
    bias: bool = True,
) -> MoELayerOps:
    """Forward ops of one MoE layer on one rank as ``framework`` runs them (see
    :data:`STACKS`): the router GEMM ``(T, E, h)`` on the rank's ``tokens``, its
    softmax/top-k and the load-balancing loss over ``T·E``; the permute of the ``sent``
    assignments before the dispatch, the re-sort of the received rows after it; the
    local experts on ``expert_rows`` (one entry per local expert; ``capacity_rows``,
    when the inputs are padded to capacity, the rows each computes instead), as one
    grouped GEMM per projection or a loop of per-expert GEMMs; the reverse reordering
    and the combine (unpermute with the routing weights; ``compiled``: under
    ``torch.compile``, torchtitan's fp32 score multiply as one fused pass). A loop's
    per-expert gathers and ``index_add_`` stand for the permute and unpermute. Shapes
    are per TP rank: the expert width ``f`` split over ``tp``."""
    stack = stack_of(framework)
    h, f = model_hidden, expert_ffn(spec, model_hidden, model_ffn)
    if f % tp:
        raise ScenarioError(f"model.moe.ffn_hidden: expert ffn({f}) is not divisible by tp({tp})")
    rows = np.asarray(expert_rows, dtype=np.int64)
    _check_nonnegative(tokens=tokens, sent=sent, rows=int(rows.min(initial=0)))
    groups = rows.size
    padded = _padded_rows(rows, capacity_rows, fp8)
    real, computed = int(rows.sum()), int(padded.sum())
    local, e, k = f // tp, spec.experts, spec.top_k
    aux = stack.aux_loss if spec.aux_loss is None else spec.aux_loss
    fused = stack.fused_permute
    # Megatron-Core's flex dispatcher (DeepEP, HybridEP): one permute after the dispatch
    flex = fused and spec.dispatcher == "deepep"
    index_bytes = 4.0 * k * tokens  # the int32 map from assignments back to tokens

    router: list[OpCost] = [
        router_op(spec, h, tokens),
        _moved("moe_router_topk", tokens * e, _ROUTER_TOPK, saved=4.0 * tokens * e),
    ]
    if aux:
        router.append(_moved("moe_aux_loss", tokens * e, _AUX_LOSS))

    dispatch: list[OpCost] = []
    received: list[OpCost] = []
    returned: list[OpCost] = []
    combine: list[OpCost] = []
    if stack.einsum_dispatch:
        # DeepSpeed: (T, E, C) combine weights (fp32) and dispatch mask (bool) written by
        # the gating, then the dispatch einsum (E·C, h, T) and the combine (T, h, E·C)
        # the E·C slots of a source rank: E/ep local experts of ep·C rows each on this one
        slots = computed
        router.append(_moved("moe_gating_masks", float(tokens) * slots, (5.0, 4.0)))
        dispatch.append(_gemm_op("moe_dispatch_einsum", slots, h, tokens))
        combine.append(
            _gemm_op("moe_combine_einsum", tokens, h, slots, saved=ACT_BYTES * slots * h)
        )
    elif stack.grouped_gemm and flex:
        # Megatron-Core's flex dispatcher (DeepEP, HybridEP without
        # moe_permute_fusion_into_hybridep): the tokens go out unpermuted, one copy per
        # destination; the received tokens are permuted once into their local experts'
        # rows and unpermuted (weighted by their probabilities) before the combine
        # (token_dispatcher.py's MoEFlexTokenDispatcher at 9c5258f1)
        received.append(_moved("moe_permute", float(real) * h, _GATHER[True], saved=index_bytes))
        returned.append(
            _moved("moe_unpermute", float(real) * h, (2.0 + 2.0 / k, 6.0), saved=index_bytes)
        )
    elif stack.grouped_gemm:  # a loop's per-expert gathers and index_add_ are its permute
        if not fused:
            dispatch.append(_moved("moe_sort", 2.0 * k * tokens, (8.0, 0.0)))  # argsort, int64
        dispatch.append(_moved("moe_permute", float(sent) * h, _GATHER[fused], saved=index_bytes))
        unpermute = (2.0 + 2.0 / k, 6.0) if fused else _GATHER[False]
        if not fused:  # torch.compile fuses the three casts and the multiply into one pass
            scores = _GATHER[True] if compiled else _SCORE_FP32
            combine.append(_moved("moe_scores", float(sent) * h, scores))
        combine.append(_moved("moe_unpermute", float(sent) * h, unpermute, saved=index_bytes))
    if stack.sort_after_dispatch and groups > 1 and not flex:
        received.append(_moved("moe_sort_chunks", float(real) * h, _GATHER[fused]))
        returned.append(_moved("moe_unsort_chunks", float(real) * h, _GATHER[fused]))
    if fp8 and stack.grouped_gemm and fused and computed != real:
        # Transformer Engine's Fp8Padding / Fp8Unpadding around the grouped MLP
        received.append(_moved("moe_fp8_pad", float(real) * h, _GATHER[True]))
        returned.insert(0, _moved("moe_fp8_unpad", float(real) * h, _GATHER[True]))

    if stack.grouped_gemm:
        experts = _grouped_experts(
            real, computed, groups, h, local, mlp, bias, stack.fused_gate_up, fp8
        )
    else:
        experts = _looped_experts(rows, padded, h, local, mlp, bias, fp8, k, tokens)
    return MoELayerOps(
        tuple(router),
        tuple(dispatch),
        tuple(received),
        tuple(experts),
        tuple(returned),
        tuple(combine),
    )


def _gemm_op(name: str, m: int, n: int, k: int, saved: float = 0.0) -> OpCost:
    """A plain GEMM ``(m, k) @ (k, n)`` without weights (DeepSpeed's einsums)."""
    flops = 2.0 * m * n * k
    traffic = ACT_BYTES * (m * k + k * n + m * n)
    return OpCost(name, GEMM, flops, traffic, 0.0, (m, n, k), saved_bytes=saved)


def _grouped_experts(
    real: int,
    computed: int,
    groups: int,
    h: int,
    local: int,
    mlp: str,
    bias: bool,
    fused_gate_up: bool,
    fp8: bool,
) -> list[OpCost]:
    """The local experts as grouped GEMMs: fc1 (gate and up fused or, as torchtitan's
    ``w1`` and ``w3``, two), the activation, fc2."""
    swiglu = mlp == "swiglu"
    saved_in = ACT_BYTES * computed * h
    if swiglu and not fused_gate_up:
        fc1 = [
            _grouped("expert_fc1", real, computed, local, h, groups, bias, saved_in),
            _grouped("expert_fc1_up", real, computed, local, h, groups, bias, saved_in),
        ]
    else:
        width = 2 * local if swiglu else local
        fc1 = [_grouped("expert_fc1", real, computed, width, h, groups, bias, saved_in)]
    fc2 = _grouped(
        "expert_fc2", real, computed, h, local, groups, bias, ACT_BYTES * computed * local
    )
    ops = [*fc1, activation_op(mlp, computed * local, prefix="expert_"), fc2]
    if not fp8:
        return ops
    return [x for op in ops for x in (_fp8_gemm(op) if op.kind == GROUPED_GEMM else [op])]


def _looped_experts(
    rows: np.ndarray,
    padded: np.ndarray,
    h: int,
    local: int,
    mlp: str,
    bias: bool,
    fp8: bool,
    top_k: int,
    tokens: int,
) -> list[OpCost]:
    """The local experts one after another (experts without rows skipped, as HF's loop
    over ``expert_hit``): per expert its rows gathered (after ``torch.where`` over the
    ``(k, T)`` mask, int64), ``w1`` (and ``w3``), the activation, ``w2``, the routing
    weight multiplied in and ``index_add_`` back. The first expert's first GEMM is
    ``expert_fc1`` and the last one's ``w2`` is ``expert_fc2``: the TP collectives
    Megatron-style tensor parallelism puts after the MLP come once, after the loop."""
    hit = [j for j in range(rows.size) if padded[j] > 0]
    ops: list[OpCost] = []
    swiglu = mlp == "swiglu"
    for position, j in enumerate(hit):
        r, p = int(rows[j]), int(padded[j])
        first, last = position == 0, position == len(hit) - 1
        gemms = []
        w1 = "expert_fc1" if first else f"expert_fc1.e{j}"
        w2 = "expert_fc2" if last else f"expert_fc2.e{j}"
        fc1 = _grouped(w1, r, p, local, h, 1, bias, ACT_BYTES * p * h)
        gemms.append(replace(fc1, kind=GEMM, batch=1))
        if swiglu:
            up = _grouped(f"expert_fc1_up.e{j}", r, p, local, h, 1, bias, ACT_BYTES * p * h)
            gemms.append(replace(up, kind=GEMM, batch=1))
        fc2 = replace(_grouped(w2, r, p, h, local, 1, bias, ACT_BYTES * p * local), kind=GEMM)
        where = _moved(f"expert_where.e{j}", float(top_k) * tokens, (8.0, 0.0))
        gather = _moved(f"expert_gather.e{j}", float(p) * h, _GATHER[False])
        act = activation_op(mlp, p * local, prefix="expert_")
        act = replace(act, name=f"{act.name}.e{j}")
        scale = _moved(f"expert_scale.e{j}", float(r) * h, (4.0, 6.0), saved=ACT_BYTES * r * h)
        add = _moved(f"expert_index_add.e{j}", float(r) * h, (6.0, 4.0))
        body = [*gemms[:1], *gemms[1:], act, fc2]
        if fp8:
            body = [x for op in body for x in (_fp8_gemm(op) if op.kind == GEMM else [op])]
        ops += [where, gather, *body, scale, add]
    return ops


def padded_capacity_rows(
    spec: MoESpec, traffic: MoELayerTraffic, ep: int, framework: str = "megatron"
) -> tuple[list[int] | None, np.ndarray | None]:
    """Rows each local expert computes, and the dispatch splits, when the stack pads
    every expert's input to its capacity (``model.moe.pad_to_capacity``, Megatron-Core's
    drop-and-pad; DeepSpeed-MoE always): each source rank sends ``capacity`` rows for
    every expert, so an expert computes ``ep · capacity`` rows and rank ``i`` sends
    ``capacity_i · E/ep`` rows to every peer. Without a capacity factor DeepSpeed pads
    to the busiest expert (``drop_tokens=False``), here its load spread evenly over the
    source ranks. ``(None, None)`` when nothing is padded."""
    stack = stack_of(framework)
    if not (spec.pad_to_capacity or stack.pads_to_capacity):
        return None, None
    per = experts_per_rank(spec, ep)
    caps = list(traffic.capacity)
    if any(c is None for c in caps):
        busiest = int(traffic.expert_tokens.max(initial=0))
        caps = [-(-busiest // ep)] * ep
    rows = [int(sum(int(c) for c in cast("list[int]", caps)))] * per  # no None left
    sent = np.asarray(caps, dtype=float) * per * traffic.bytes_per_token
    return rows, np.repeat(sent[:, None], ep, axis=1)
