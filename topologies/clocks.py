"""Power limits and the tensor-core clock they leave a GPU under a GEMM load.

A GPU's datasheet peaks (``peak_flops``, ``fp8_peak_flops``) are its tensor cores' rate
at one clock, ``boost_clock_hz``: SMs × FLOP per SM per clock × clock (the A100's 312
TFLOP/s is 108 SMs × 2,048 × 1410 MHz, the H100 SXM's 989.4 is 132 × 4,096 × 1830 MHz).
A GEMM-heavy load does not hold that clock: the board reaches its power limit first,
and the firmware lowers the SM clock, and the voltage with it, until the board's power
fits. At the default limit, the board's TDP (``tdp_w``), such a load runs at
``sustained_clock_hz``. The presets' efficiencies already hold that clock: their
``matmul_efficiency`` and ``attention_efficiency`` are anchored on microbenchmarks run at
the default limit (S. Bekman's matmul measurements, FlashAttention's papers) and their
``sustained_fraction`` is fitted on training runs at it (the open validation suite), so
nothing here scales them by sustained/boost, and a GPU without ``power_limit_w``
computes exactly as before.

A limit below the TDP (``power_limit_w``, what ``nvidia-smi -pl`` sets) lowers the
sustained clock further. The board's power under a GEMM load is modelled as

    P(f) = P_static + k·f³

``P_static`` (``static_power_w``) is the part that does not follow the SM clock (HBM,
I/O, the board, leakage); the rest is the SMs' switching power ``α·C·V²·f``, with the
voltage roughly proportional to the clock across the DVFS range, hence ``f³``. ``k`` is
fixed by the board drawing its TDP at the sustained clock, so

    f(P) = f_TDP · ((P − P_static) / (TDP − P_static))^(1/3)

and compute-bound time scales by ``f_TDP / f(P)``: :func:`compute_clock_factor` is
the factor the compute peaks are multiplied by. What does not run on the SM clock does
not change: HBM-bound kernels (the memory clock stays at its maximum under a power cap:
an RTX 3090 capped at 315 W kept its 9,501 MHz memory clock in every sample while
``sw_power_cap`` throttled its SMs, github.com/ashalliants/ninfer-3090 pull 72),
collectives and transfers (NVLink and the NICs), and memory. MFU and HFU stay quoted against the
datasheet peak, so a capped run shows the lower MFU it would measure.

A limit above the TDP, below the board's minimum enforceable limit (``nvidia-smi``'s
*Min Power Limit*, ``min_power_limit_w``) or at or below ``static_power_w`` is refused
in one line (:func:`check_power_limit`).

Simplified:

- One power curve for every compute kernel: a GEMM's. Attention and small GEMMs draw
  less per clock and may keep a higher clock under the same limit; elementwise kernels
  are HBM-bound and untouched.
- Below the DVFS range the voltage stops falling with the clock and power falls only
  linearly with it, so a deep cap (near ``min_power_limit_w``) costs more clock than
  the cube law says: the model is optimistic there.
- ``static_power_w`` is the board's draw at P0 with nothing running (its leakage at idle
  temperature); a hot board under load leaks more.
- Ops a calibration profile measured (``op_table``) keep their measured time, and a
  profile's efficiencies are taken as measured at the TDP.
"""

from __future__ import annotations

from typing import Protocol

from .errors import TopologyError

__all__ = [
    "DYNAMIC_EXPONENT",
    "PowerFields",
    "clock_ratio",
    "compute_clock_factor",
    "check_power_limit",
]


class PowerFields(Protocol):
    """The GPU fields the clock-power curve reads (:class:`topologies.spec.GPUSpec`
    has them)."""

    tdp_w: float | None
    power_limit_w: float | None
    min_power_limit_w: float | None
    static_power_w: float | None


#: The exponent of the clock in the SMs' switching power ``α·C·V²·f`` with ``V ∝ f``:
#: the DVFS range of a GPU, where the firmware lowers voltage with the clock.
DYNAMIC_EXPONENT = 3.0


def clock_ratio(gpu: PowerFields, limit_w: float) -> float:
    """``f(limit) / f(TDP)``: the sustained GEMM clock at ``limit_w`` watts over the one
    at the TDP, from ``P = P_static + k·f³``. Needs ``tdp_w`` and ``static_power_w``."""
    if gpu.tdp_w is None or gpu.static_power_w is None:
        raise ValueError("the clock-power curve needs tdp_w and static_power_w")
    dynamic_at_limit = limit_w - gpu.static_power_w
    dynamic_at_tdp = gpu.tdp_w - gpu.static_power_w
    return (dynamic_at_limit / dynamic_at_tdp) ** (1.0 / DYNAMIC_EXPONENT)


def compute_clock_factor(gpu: PowerFields) -> float:
    """What the compute peaks are multiplied by at the GPU's power limit, relative to
    what its efficiencies assume (the sustained clock at the TDP): 1.0 without
    ``power_limit_w`` or at the TDP, ``f(limit)/f(TDP)`` below it."""
    if gpu.power_limit_w is None or gpu.power_limit_w == gpu.tdp_w:
        return 1.0
    return clock_ratio(gpu, gpu.power_limit_w)


def check_power_limit(gpu: PowerFields, prefix: str = "cluster.gpu") -> None:
    """The GPU's power fields against each other; raises :class:`TopologyError` with one
    line naming the field and the numbers."""
    tdp, floor, static = gpu.tdp_w, gpu.min_power_limit_w, gpu.static_power_w
    if tdp is not None and floor is not None and floor > tdp:
        raise TopologyError(
            f"{prefix}.min_power_limit_w: {floor:g} W is above the board's TDP (tdp_w {tdp:g} W)"
        )
    if tdp is not None and static is not None and static >= tdp:
        raise TopologyError(
            f"{prefix}.static_power_w: {static:g} W must be below the board's TDP (tdp_w {tdp:g} W)"
        )
    limit = gpu.power_limit_w
    if limit is None:
        return
    if tdp is None or static is None:
        missing = " and ".join(
            name for name, value in (("tdp_w", tdp), ("static_power_w", static)) if value is None
        )
        raise TopologyError(
            f"{prefix}.power_limit_w: {limit:g} W needs the GPU's {missing} (its power "
            f"curve); the presets give them"
        )
    if limit > tdp:
        raise TopologyError(
            f"{prefix}.power_limit_w: {limit:g} W is above the board's TDP (tdp_w "
            f"{tdp:g} W); a power limit can only lower it"
        )
    if floor is not None and limit < floor:
        raise TopologyError(
            f"{prefix}.power_limit_w: {limit:g} W is below the board's minimum "
            f"enforceable limit (min_power_limit_w {floor:g} W); give {floor:g} to {tdp:g} W"
        )
    if limit <= static:
        raise TopologyError(
            f"{prefix}.power_limit_w: {limit:g} W is not above the power the board draws "
            f"at any clock (static_power_w {static:g} W)"
        )
