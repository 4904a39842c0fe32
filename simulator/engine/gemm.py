"""How fast a GEMM of a given shape runs: tile and wave quantisation over the SMs.

cuBLAS splits the ``m × n`` output of a GEMM into thread-block tiles, one per CTA, and
runs them in *waves* of one tile per SM (NVIDIA, "Matrix Multiplication Background
User's Guide", Deep Learning Performance documentation: sections "Dimension
Quantization Effects", "Tile Quantization" and "Wave Quantization"). Three effects
follow, and this model multiplies them onto one base efficiency per GPU (the fraction
of peak a large, well-shaped GEMM reaches in public microbenchmarks, from the preset):

* **tile quantisation**: a dimension that is not a multiple of the tile still pays
  for whole tiles (``m·n / (⌈m/Mt⌉·Mt · ⌈n/Nt⌉·Nt)`` of the work is useful);
* **wave quantisation**: ``tiles`` CTAs over ``SMs`` take ``⌈tiles/SMs⌉`` waves, so a
  shape one tile past a full wave runs almost twice as long as one that fills it;
* **tile size**: smaller tiles fit ragged shapes better but reuse each loaded element
  less; a tile of ``Mt × Nt`` loads ``Mt + Nt`` elements per ``Mt·Nt`` multiply-adds
  of each k-step, and its relative speed is modelled as ``(1 + c/I₀)/(1 + c/I)`` with
  ``I = Mt·Nt/(Mt+Nt)`` (``I₀`` of the GPU's largest tile; ``c`` puts a 128×128 tile
  at 0.9 of a 256×128 one on the same shape);
* **short k**: each tile pays a prologue and epilogue (loading the pipeline, writing
  the result) worth about ``K_OVERHEAD`` elements of ``k``, so its main loop runs at
  ``k / (k + K_OVERHEAD)``; when the output has fewer tiles than SMs, cuBLAS splits
  ``k`` across CTAs (split-K), which this model allows in powers of two.

An FP8 GEMM runs the same model with ``FP8_K_OVERHEAD_FACTOR`` times the prologue and
epilogue in elements of ``k``: its tensor cores do a k-slice's math in half the time,
while filling the pipeline (the same bytes) and writing the BF16 output tile take as
long as in BF16 (CUTLASS's Hopper FP8 mainloops stage 128-deep k-slices where the BF16
ones stage 64).

cuBLAS's heuristics pick the tile and split that run fastest, so the model does too;
the result never exceeds the base efficiency. A calibration profile can replace the
model by a table of measured efficiencies by shape (:class:`GemmEfficiency` takes it):
a measured shape gets its measured value, another shape the nearest measurement scaled
by the model's ratio between the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "K_OVERHEAD",
    "FP8_K_OVERHEAD_FACTOR",
    "TILE_REUSE_CONSTANT",
    "tile_shapes",
    "gemm_efficiency",
    "GemmEfficiency",
]

# Prologue + epilogue of a CTA in units of k: a 4-deep cp.async/TMA pipeline of 64-deep
# k-slices fills before the first MMA and drains after the last, then the epilogue
# writes the tile (CUTLASS's default Ampere/Hopper mainloops: 4 stages x 64 = 256).
K_OVERHEAD = 256.0
# An FP8 GEMM's prologue and epilogue in elements of k, relative to BF16's: the same
# bytes to stage and the same BF16 tile to write, at twice the math rate per element.
# Measured on an H200 (benchmarks/kernel_sweep.py, RESULTS.md "Kernels on one H200"):
# the model over 19 training shapes is 18% fast at a factor of 1, 10% at 2.
FP8_K_OVERHEAD_FACTOR = 2.0
# Puts a 128x128 tile at 0.9 of a 256x128 tile's speed on a shape both tile exactly.
TILE_REUSE_CONSTANT = 42.7


def tile_shapes(largest: Sequence[int]) -> list[tuple[int, int]]:
    """The CTA tiles cuBLAS chooses from, largest first: the GPU's largest tile and its
    halvings down to 64 × 64 (both orientations)."""
    tm, tn = int(largest[0]), int(largest[1])
    shapes: dict[tuple[int, int], None] = {}
    a, b = tm, tn
    while a >= 64 and b >= 64:
        shapes[(a, b)] = None
        shapes[(b, a)] = None
        if a >= b:
            a //= 2
        else:
            b //= 2
    return list(shapes)


def _reuse(tile: tuple[int, int]) -> float:
    return tile[0] * tile[1] / (tile[0] + tile[1])


def gemm_efficiency(
    m: int,
    n: int,
    k: int,
    *,
    base: float,
    sm_count: int,
    largest_tile: Sequence[int],
    batch: int = 1,
    k_overhead: float = K_OVERHEAD,
) -> float:
    """Fraction of peak a ``batch × (m, n, k)`` GEMM reaches (see the module docstring);
    ``k_overhead`` is a tile's prologue and epilogue in elements of ``k``."""
    if min(m, n, k, batch) <= 0:
        return base
    best_reuse = _reuse((int(largest_tile[0]), int(largest_tile[1])))
    best = 0.0
    for tile in tile_shapes(largest_tile):
        tm, tn = tile
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        useful = (m * n) / (tiles_m * tm * tiles_n * tn)
        relative = (1 + TILE_REUSE_CONSTANT / best_reuse) / (1 + TILE_REUSE_CONSTANT / _reuse(tile))
        tiles = batch * tiles_m * tiles_n
        split = 1
        while True:
            ctas = tiles * split
            waves = math.ceil(ctas / sm_count)
            occupancy = ctas / (waves * sm_count)
            k_part = k / split
            efficiency = useful * relative * occupancy * k_part / (k_part + k_overhead)
            best = max(best, efficiency)
            # split-K only helps an output with fewer tiles than SMs, down to 256-deep k
            if tiles * split * 2 > sm_count or k_part / 2 < 256:
                break
            split *= 2
    return base * best


class GemmEfficiency:
    """The GEMM efficiency model of one GPU type, memoised by shape; with a measured
    ``table`` (``(m, n, k, efficiency)`` rows) it anchors on the nearest measurement."""

    def __init__(
        self,
        base: float,
        sm_count: int | None,
        largest_tile: Sequence[int] | None,
        table: Sequence[Sequence[float]] = (),
        k_overhead: float = K_OVERHEAD,
    ):
        self.base = base
        self.k_overhead = k_overhead
        self.sm_count = sm_count
        self.largest_tile = tuple(int(x) for x in largest_tile) if largest_tile else None
        self.table = [(int(m), int(n), int(k), float(e)) for m, n, k, e in table]
        self._memo: dict[tuple[int, int, int, int], float] = {}

    def model(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """The shape model's efficiency (the base alone without SMs and a tile)."""
        if self.sm_count is None or self.largest_tile is None:
            return self.base
        return gemm_efficiency(
            m,
            n,
            k,
            base=self.base,
            sm_count=self.sm_count,
            largest_tile=self.largest_tile,
            batch=batch,
            k_overhead=self.k_overhead,
        )

    def __call__(self, m: int, n: int, k: int, batch: int = 1) -> float:
        key = (m, n, k, batch)
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._measured(m, n, k, batch)
        return cached

    def _measured(self, m: int, n: int, k: int, batch: int) -> float:
        if not self.table:
            return self.model(m, n, k, batch)
        logs = (math.log(m * batch), math.log(n), math.log(k))

        def distance(row: tuple[int, int, int, float]) -> float:
            return sum((a - math.log(b)) ** 2 for a, b in zip(logs, row[:3], strict=True))

        near = min(self.table, key=distance)
        if distance(near) == 0.0:
            return near[3]
        scale = self.model(m, n, k, batch) / self.model(near[0], near[1], near[2])
        return min(1.0, near[3] * scale)
