"""Llama-style transformer blocks in plain PyTorch, as torchtitan writes them, for the
kernel sweep (:mod:`benchmarks.kernel_sweep`) to time on a GPU.

A block: RMSNorm computed in fp32, separate Q, K and V projections, complex rotary
embedding, ``F.scaled_dot_product_attention`` (causal, grouped-query where the key and
value heads are fewer), and a SwiGLU MLP with separate gate and up projections; heads
of width :data:`~benchmarks.kernel_sweep.HEAD_DIM`. The MoE block replaces the MLP with
a torchtitan-style mixture of experts (router softmax in fp32, top-k, ``argsort``, an
index gather, ``torch._grouped_mm`` for w1, w3 and w2, the scores multiplied in fp32,
``index_add_`` back), its routing forced to balance as the Megatron-LM recipes force
it. Each ``*_step`` function builds its module on the device and returns a call that
runs one forward and backward (and, for :func:`training_step`, the optimizer).

This module imports torch; :mod:`benchmarks.kernel_sweep` imports it only to measure.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.kernel_sweep import HEAD_DIM

__all__ = ["block_step", "moe_block_step", "training_step"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y.type_as(x) * self.weight


def rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """torchtitan's complex rotary embedding of ``x`` (batch, sequence, heads, width)."""
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * freqs).flatten(3).type_as(x)


def frequencies(seq: int, device: str) -> torch.Tensor:
    """The rotary embedding's complex frequencies for ``seq`` positions."""
    inverse = 1e4 ** (-torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM)
    angles = torch.outer(torch.arange(seq, device=device).float(), inverse)
    return torch.polar(torch.ones_like(angles), angles).view(1, seq, 1, -1)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.wq = nn.Linear(hidden, heads * HEAD_DIM, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * HEAD_DIM, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * HEAD_DIM, bias=False)
        self.wo = nn.Linear(heads * HEAD_DIM, hidden, bias=False)
        if ffn:
            self.w1 = nn.Linear(hidden, ffn, bias=False)
            self.w3 = nn.Linear(hidden, ffn, bias=False)
            self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm1(x)
        q = rope(self.wq(h).view(b, s, self.heads, HEAD_DIM), freqs)
        k = rope(self.wk(h).view(b, s, self.kv_heads, HEAD_DIM), freqs)
        v = self.wv(h).view(b, s, self.kv_heads, HEAD_DIM)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        gqa = {"enable_gqa": True} if self.kv_heads != self.heads else {}
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(h)) * self.w3(h))


class MoE(nn.Module):
    """A torchtitan-style MoE MLP. ``sync``: read the per-expert row counts on the host
    in every forward (``counts.tolist()``), as a dropless MoE does that sizes its expert
    GEMMs or its all-to-all splits on the host: the host then waits for the GPU."""

    def __init__(self, hidden: int, experts: int, top_k: int, ffn: int, sync: bool = False):
        super().__init__()
        self.experts, self.top_k, self.sync = experts, top_k, sync
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, ffn, hidden) * 0.02)
        self.w3 = nn.Parameter(torch.randn(experts, ffn, hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, ffn) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[0]
        scores = F.softmax(self.gate(x).float(), dim=-1)
        top_scores, _ = torch.topk(scores, self.top_k, dim=-1)
        # balanced routing (each expert gets tokens·k/E rows), the chosen experts' scores
        # kept: the recipes force the load to balance
        chosen = torch.arange(tokens * self.top_k, device=x.device) % self.experts
        order = torch.argsort(chosen, stable=True)
        counts = torch.bincount(chosen, minlength=self.experts)
        if self.sync:
            counts.tolist()  # a device-to-host copy the host waits for
        offs = torch.cumsum(counts, 0).to(torch.int32)
        token_index = order // self.top_k
        routed = x[token_index]
        gate = torch._grouped_mm(routed, self.w1.transpose(-2, -1), offs=offs)
        up = torch._grouped_mm(routed, self.w3.transpose(-2, -1), offs=offs)
        out = torch._grouped_mm(F.silu(gate) * up, self.w2.transpose(-2, -1), offs=offs)
        weights = top_scores.flatten()[order].unsqueeze(-1)
        out = (out.float() * weights).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token_index, out)


class MoEBlock(Block):
    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        experts: int,
        top_k: int,
        ffn: int,
        sync: bool = False,
    ):
        super().__init__(hidden, heads, kv_heads, ffn=0)
        self.moe = MoE(hidden, experts, top_k, ffn, sync)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.moe(h.flatten(0, 1)).view_as(h)


class Model(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, layers: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, freqs)
        return self.out(self.norm(x))


def _backward_of(block: nn.Module, device, dtype, hidden: int, seq: int, batch: int):
    x = torch.randn(batch, seq, hidden, device=device, dtype=dtype, requires_grad=True)
    freqs, grad = frequencies(seq, device), torch.randn_like(x)
    return lambda: block(x, freqs).backward(grad)


def block_step(device, dtype, hidden, heads, kv_heads, ffn, seq, batch, mode) -> Callable:
    """Forward and backward of one block, eager or under ``torch.compile``."""
    block = Block(hidden, heads, kv_heads, ffn).to(device=device, dtype=dtype)
    run = torch.compile(block) if mode == "compile" else block
    return _backward_of(run, device, dtype, hidden, seq, batch)


def moe_block_step(
    device, dtype, hidden, heads, kv_heads, experts, top_k, ffn, seq, batch, sync=False
):
    """Forward and backward of one block with the MoE MLP, eager (``sync``: the host
    reads the expert row counts in the forward, :class:`MoE`)."""
    block = MoEBlock(hidden, heads, kv_heads, experts, top_k, ffn, sync)
    block = block.to(device=device, dtype=dtype)
    return _backward_of(block, device, dtype, hidden, seq, batch)


def training_step(device, dtype, hidden, heads, ffn, layers, vocab, seq, batch, mode):
    """One training step: embedding, ``layers`` blocks, final norm, output layer,
    cross-entropy in fp32, backward, fused AdamW on the bf16 parameters."""
    model = Model(hidden, heads, ffn, layers, vocab).to(device=device, dtype=dtype)
    run = torch.compile(model) if mode == "compile" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    freqs = frequencies(seq, device)

    def step():
        logits = run(tokens, freqs)
        F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
