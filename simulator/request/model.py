"""The shape of a decoder-only transformer, the published presets, and closed forms.

A model is a stack of ``layers`` identical blocks between a token embedding and an
output (logits) layer. The block is the one people train today or trained then:

* ``mlp``: ``gelu`` (GPT: two matrices, ``h → f → h``) or ``swiglu`` (Llama, Mixtral:
  a gate and an up projection of width ``f`` each, then ``f → h``: three matrices);
* ``norm``: ``layernorm`` (weight and bias) or ``rmsnorm`` (weight only);
* ``position``: ``learned`` (a ``seq_len × h`` table added to the token embedding, GPT)
  or ``rope`` (rotary embeddings applied to queries and keys, no parameters);
* ``kv_heads``: grouped-query attention (GQA, Ainslie et al. 2023) shares each key and
  value head between ``heads / kv_heads`` query heads; ``kv_heads = heads`` is plain
  multi-head attention, ``kv_heads = 1`` multi-query attention;
* ``bias``: whether the linear layers carry biases (GPT yes, Llama no);
* ``tie_embeddings``: whether the output layer reuses the token embedding matrix
  (GPT-2/3 and Megatron-LM's GPT yes, Llama no);
* ``dropout``: whether the block runs dropout (attention probabilities and the two
  residual branches, as Megatron-LM's GPT does; Llama-style recipes run none).

The per-op costs of a block are in :mod:`simulator.arithmetic.layer_ops`; this module holds the
shape, the presets with their published sources, the parameter count in closed form,
and the reference formulas the op sums must reproduce in their limiting cases
(Megatron-LM's model FLOPs and Korthikanti et al.'s activation memory).
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from simulator.common.vocabulary import (
    MlpKind,
    NormKind,
    PositionKind,
)
from topologies.validation import ConfigModel

__all__ = [
    "ModelSpec",
    "MODEL_PRESETS",
    "PUBLISHED_PARAMETERS",
]


class ModelSpec(ConfigModel):
    """Shape of a decoder-only transformer (the scenario's ``model:`` section)."""

    name: str = "custom"
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    # per-head width of queries, keys and values (None: hidden / heads); Qwen3 and
    # DeepSeek-V3's presets set it wider than hidden / heads
    head_dim: int | None = Field(default=None, gt=0)
    heads: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    vocab: int = Field(gt=0)
    ffn_hidden: int | None = Field(default=None, gt=0)
    kv_heads: int | None = Field(default=None, gt=0)
    mlp: MlpKind = "gelu"
    norm: NormKind = "layernorm"
    position: PositionKind = "learned"
    bias: bool = True
    tie_embeddings: bool = True
    dropout: bool = True

    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, heads: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")
        if info.data.get("head_dim") is None and hidden is not None and hidden % heads:
            raise ValueError(
                f"hidden({hidden}) is not divisible by heads({heads}) (or give head_dim)"
            )
        return heads

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, kv_heads: int | None, info: ValidationInfo) -> int | None:
        heads = info.data.get("heads")
        if kv_heads is not None and heads is not None and heads % kv_heads:
            raise ValueError(f"heads({heads}) is not divisible by kv_heads({kv_heads})")
        return kv_heads

    @model_validator(mode="after")
    def _defaults(self) -> ModelSpec:
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise ValueError(
                    f"hidden({self.hidden}) is not divisible by heads({self.heads}); give head_dim"
                )
            self.head_dim = self.hidden // self.heads
        if self.kv_heads is None:
            self.kv_heads = self.heads
        if self.ffn_hidden is None:
            self.ffn_hidden = 4 * self.hidden
        return self

    @property
    def ffn(self) -> int:
        assert self.ffn_hidden is not None
        return self.ffn_hidden

    @property
    def kv(self) -> int:
        """Key/value heads."""
        assert self.kv_heads is not None
        return self.kv_heads


# Llama-style blocks: SwiGLU MLP, RMSNorm, rotary positions, no biases, no dropout.
_LLAMA = dict(mlp="swiglu", norm="rmsnorm", position="rope", bias=False, dropout=False)

# Published shapes, each with its source. GPT-3: Brown et al. 2020, table 2.1 (seq 2048,
# vocab 50257, padded to 51200 as Megatron-LM does for tensor-parallel divisibility).
# GPT-2: Radford et al. 2019. Megatron 530B and 1T: Narayanan et al. SC'21 table 1 /
# Smith et al. 2022 (MT-NLG). Llama 2: Touvron et al. 2023, "Llama 2", table 1 and the
# released configs (llama-2-7b/70b params.json: dim, n_layers, n_heads, n_kv_heads,
# ffn_dim_multiplier, vocab_size 32000). Llama 3: "The Llama 3 Herd of Models"
# (Dubey et al. 2024), table 3 (layers, model dimension, FFN dimension, attention and
# key/value heads, vocabulary 128,000 + 256 special = 128,256), pre-training context
# 8,192. Mixtral: Jiang et al. 2024, "Mixtral of Experts", table 1 (dim 4096, 32
# layers, head dim 128, 32 heads, 8 kv heads, hidden 14336, context 32768, vocab 32000,
# 8 experts, top-2); Mixtral 8x22B: the released config.json of
# mistralai/Mixtral-8x22B-v0.1 (hidden 6144, 56 layers, 48 heads, 8 kv heads,
# intermediate 16384, vocab 32000, 8 experts, top-2, context 65536).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-small": dict(layers=12, hidden=768, heads=12, seq_len=1024, vocab=50304),
    "gpt2-xl": dict(layers=48, hidden=1600, heads=25, seq_len=1024, vocab=50304),
    "gpt3-1.3b": dict(layers=24, hidden=2048, heads=16, seq_len=2048, vocab=51200),
    "gpt3-6.7b": dict(layers=32, hidden=4096, heads=32, seq_len=2048, vocab=51200),
    "gpt3-13b": dict(layers=40, hidden=5120, heads=40, seq_len=2048, vocab=51200),
    "gpt3-175b": dict(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200),
    "mt-nlg-530b": dict(layers=105, hidden=20480, heads=128, seq_len=2048, vocab=51200),
    "megatron-1t": dict(layers=128, hidden=25600, heads=160, seq_len=2048, vocab=51200),
    # A 70B-class dense decoder with LLaMA-2-70B's depth, width, heads, context and
    # vocabulary, but the GPT block (GELU MLP of 4h, multi-head attention): about 65 B
    # parameters. For the real Llama 2 70B block use llama2-70b.
    "dense-70b": dict(layers=80, hidden=8192, heads=64, seq_len=4096, vocab=32000),
    "llama2-7b": dict(
        layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, seq_len=4096,
        vocab=32000, tie_embeddings=False, **_LLAMA,
    ),
    "llama2-70b": dict(
        layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, seq_len=4096,
        vocab=32000, tie_embeddings=False, **_LLAMA,
    ),
    "llama3-8b": dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq_len=8192,
        vocab=128256, tie_embeddings=False, **_LLAMA,
    ),
    "llama3-70b": dict(
        layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, seq_len=8192,
        vocab=128256, tie_embeddings=False, **_LLAMA,
    ),
    "llama3-405b": dict(
        layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, seq_len=8192,
        vocab=128256, tie_embeddings=False, **_LLAMA,
    ),
    "mixtral-8x7b": dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq_len=4096,
        vocab=32000, tie_embeddings=False, **_LLAMA,
        moe=dict(experts=8, top_k=2, every=1),
    ),
    "mixtral-8x22b": dict(
        layers=56, hidden=6144, heads=48, kv_heads=8, ffn_hidden=16384, seq_len=4096,
        vocab=32000, tie_embeddings=False, **_LLAMA,
        moe=dict(experts=8, top_k=2, every=1),
    ),
    # Qwen/Qwen3-30B-A3B model card and config.json: 48 layers, hidden 2048, 32 query and
    # 4 key/value heads of width 128, 128 experts of width 768 with 8 active, vocabulary
    # 151,936, untied embeddings, no shared experts; 4K pre-training context (Qwen3
    # technical report, section 3). Its per-head query/key RMSNorm is left out.
    "qwen3-30b-a3b": dict(
        layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn_hidden=6144,
        seq_len=4096, vocab=151936, tie_embeddings=False, **_LLAMA,
        moe=dict(experts=128, top_k=8, expert_ffn_hidden=768),
    ),
    # DeepSeek-V3 (DeepSeek-AI 2024, arXiv 2412.19437, section 4.2): 61 layers, hidden
    # 7168, 128 heads; the first 3 layers dense (FFN 18432), the others 256 routed experts
    # of width 2048 with 8 active and 1 shared expert, each token sent to at most 4
    # nodes; vocabulary 129,280, untied embeddings; 4K pre-training context. Multi-head
    # latent attention is approximated as attention with 128 query heads of width 128 and
    # one key/value head (2% more parameters than MLA's low-rank projections, 80% of its
    # attention FLOPs); the multi-token prediction module is left out.
    "deepseek-v3-like": dict(
        layers=61, hidden=7168, heads=128, kv_heads=1, head_dim=128, ffn_hidden=18432,
        seq_len=4096, vocab=129280, tie_embeddings=False, **_LLAMA,
        moe=dict(experts=256, top_k=8, expert_ffn_hidden=2048, shared_experts=1,
                 first_dense=3, max_nodes_per_token=4),
    ),
}  # fmt: skip

# Published parameter totals, for the presets whose source states one exactly enough
# to check against (the tests hold every preset within 0.5% of these; GPT-3's smaller
# sizes are published rounded to two digits, "1.3B", and are left out).
PUBLISHED_PARAMETERS: dict[str, tuple[float, str]] = {
    "gpt3-175b": (175.0e9, "Brown et al. 2020, table 2.1: 175.0B"),
    "gpt2-xl": (1.558e9, "Radford et al. 2019 / released GPT-2 XL: 1,558M"),
    "mt-nlg-530b": (530e9, "Smith et al. 2022, MT-NLG: 530B"),
    "megatron-1t": (1008.0e9, "Narayanan et al. SC'21, table 1: 1008.0B"),
    "llama2-7b": (6.74e9, "Touvron et al. 2023 / meta-llama/Llama-2-7b model card: 6.74B"),
    "llama2-70b": (68.98e9, "meta-llama/Llama-2-70b-hf model card (safetensors): 69.0B"),
    "llama3-8b": (8.03e9, "meta-llama/Meta-Llama-3-8B model card (safetensors): 8.03B"),
    "llama3-70b": (70.6e9, "meta-llama/Meta-Llama-3-70B model card (safetensors): 70.6B"),
    "llama3-405b": (405.9e9, "meta-llama/Llama-3.1-405B model card (safetensors): 406B"),
    "mixtral-8x7b": (46.7e9, "Jiang et al. 2024, section 2: 47B total (46.7B)"),
    "mixtral-8x22b": (140.6e9, "mistralai/Mixtral-8x22B-v0.1 model card: 141B total"),
    "qwen3-30b-a3b": (30.5e9, "Qwen/Qwen3-30B-A3B model card: 30.5B in total"),
    "deepseek-v3-like": (671e9, "DeepSeek-V3 technical report, abstract: 671B total"),
}
