"""A whole training run, not one step: the scenario's ``run:`` section.

A layout is chosen to train a model on some number of tokens, by a date, within a
budget and a power envelope. ``run:`` says what ``parasim plan`` needs for that:

```yaml
run:
  tokens: 15.6e12                     # tokens to train
  phases:                             # optional: a recipe's phases, in order
    - {name: ramp, tokens: 2.5e11, set: [training.global_batch=1024]}
    - {name: main, tokens: 1.53e13}
    - {name: long-context, tokens: 8e11, set: [model.seq_len=131072, parallel.cp=16]}
  failures: {per_gpu_hour: llama3}    # or a rate per cause, or {mtbf_node: "40 days"}
  checkpoint: {interval: auto, bandwidth_per_node: "2 GB/s", asynchronous: false}
  restart: "10 min"
  price_per_gpu_hour: 2.0
  power: {pue: 1.1}
```

Each phase's ``set`` overrides the scenario as ``--set`` does (batch, sequence length,
layout); phases' tokens add up to ``tokens`` (checked). Without phases the run is one
phase of all its tokens.

Failures are a rate per GPU-hour, by cause (``llama3``: the unexpected interruptions of
Llama 3 405B's pre-training, :data:`LLAMA3_INTERRUPTIONS`), or a mean time between
failures of one node. The checkpoint's interval is a duration or ``auto`` (the interval
that loses least: Young's and Daly's optimum, :mod:`simulator.tools.goodput`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from topologies.spec import PositiveBandwidth, Ratio
from topologies.units import Duration, Watts
from topologies.validation import ConfigModel, Name

__all__ = [
    "LLAMA3_GPU_HOURS",
    "LLAMA3_INTERRUPTIONS",
    "CheckpointSpec",
    "FailureSpec",
    "PhaseSpec",
    "PowerSpec",
    "RunSpec",
]

#: The unexpected interruptions of Llama 3 405B's pre-training by root cause, over a
#: 54-day snapshot on 16,384 H100 GPUs: Dubey et al., "The Llama 3 Herd of Models"
#: (Meta, 2024), section 3.3.4, Table 5 (419 unexpected of 466 interruptions; the 47
#: planned ones, for maintenance and updates, are a restart the operator chooses). The
#: counts add up to 419; the table's printed percentages do not match them (148 of 419
#: is 35.3%, printed 30.1%): the counts are taken.
LLAMA3_INTERRUPTIONS: dict[str, int] = {
    "faulty_gpu": 148,
    "gpu_hbm3_memory": 72,
    "software_bug": 54,
    "network_switch_or_cable": 35,
    "host_maintenance": 32,
    "gpu_sram_memory": 19,
    "gpu_system_processor": 17,
    "nic": 7,
    "nccl_watchdog_timeout": 7,
    "silent_data_corruption": 6,
    "gpu_thermal_interface_and_sensor": 6,
    "ssd": 3,
    "power_supply": 3,
    "server_chassis": 2,
    "io_expansion_board": 2,
    "dependency": 2,
    "cpu": 2,
    "system_memory": 2,
}
#: The GPU-hours of that snapshot: 16,384 GPUs for 54 days.
LLAMA3_GPU_HOURS = 16_384 * 54 * 24
Rate = Annotated[float, Field(ge=0, le=1.0)]
Tokens = Annotated[float, Field(gt=0, le=1e17)]


class _Run(ConfigModel):
    """A ``run:`` section's part: its fields checked as strictly as a scenario's."""


class PhaseSpec(_Run):
    """A phase of the recipe: its tokens and the scenario's overrides it runs with."""

    name: Name
    tokens: Tokens
    set: list[str] = Field(default=[], max_length=64)


class FailureSpec(_Run):
    """How often the run is interrupted: a rate per GPU-hour by cause (``llama3``:
    :data:`LLAMA3_INTERRUPTIONS` over :data:`LLAMA3_GPU_HOURS`), or a node's mean time
    between failures (a node fails as a whole: every GPU of it)."""

    per_gpu_hour: Literal["llama3", "none"] | dict[str, Rate] = "llama3"
    mtbf_node: Duration | None = None

    def rates(self) -> dict[str, float]:
        """Failures per GPU-hour, by cause (a node's MTBF: ``node`` per GPU-hour of its
        GPUs is given by :meth:`rate_per_gpu_hour`)."""
        if self.mtbf_node is not None:
            return {}
        if self.per_gpu_hour == "llama3":
            return {cause: n / LLAMA3_GPU_HOURS for cause, n in LLAMA3_INTERRUPTIONS.items()}
        if self.per_gpu_hour == "none":
            return {}
        return dict(self.per_gpu_hour)

    def rate_per_gpu_hour(self, gpus_per_node: int) -> float:
        """Failures per GPU-hour, all causes."""
        if self.mtbf_node is not None:
            return 3600.0 / self.mtbf_node / gpus_per_node
        return sum(self.rates().values())


class CheckpointSpec(_Run):
    """How the run saves its state: every ``interval`` of training (``auto``: the
    interval that loses least), to storage at ``bandwidth_per_node`` (each node's share
    of the file system's), blocking the step or ``asynchronous`` (the step waits for a
    copy to host memory only); ``sharded``: every rank writes its share of the state
    (torch.distributed.checkpoint, Megatron-Core's fully parallel save; ``auto``: where
    the optimizer is sharded), or one data-parallel replica writes it all."""

    interval: Literal["auto"] | Duration = "auto"
    # 1 GB/s per node: Llama 3's checkpoints went to Tectonic at 2 TB/s sustained (7 TB/s
    # at peak) from its 2,048 nodes of 8 H100s (Dubey et al. 2024, section 3.3.1)
    bandwidth_per_node: PositiveBandwidth = 1e9
    asynchronous: bool = False
    sharded: Literal["auto"] | bool = "auto"


class PowerSpec(_Run):
    """What the run's power comes to beyond its GPUs: each node's other parts (CPUs,
    NICs, switches, fans) while the step runs (default: the node's datasheet maximum
    less its GPUs' TDP, :data:`simulator.analysis.power.NODE_OTHER_W`), and the
    facility's overhead (``pue``: power usage effectiveness)."""

    # 1.1: a hyperscale data centre's (Meta's buildings completed in 2021: 1.09); the
    # industry's average was 1.58 in 2023 (Uptime Institute's global survey)
    pue: Ratio = 1.1
    node_other_w: Watts | None = None


class RunSpec(_Run):
    """The whole run: its tokens, phases, failures, checkpoints, restarts, price and
    power."""

    tokens: Tokens
    phases: list[PhaseSpec] = Field(default=[], max_length=32)
    failures: FailureSpec = FailureSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    # 10 minutes from an interruption to training again (the job rescheduled on healthy
    # nodes, NCCL's communicators made again, the last checkpoint read back): Meta's
    # research clusters restart jobs in 5 to 20 minutes (Kokolis et al., "Revisiting
    # Reliability in Large-Scale Machine Learning Research Clusters", 2024)
    restart: Duration = 600.0
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=1e4)
    power: PowerSpec = PowerSpec()
    trials: int = Field(default=200, ge=1, le=100_000)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _phases_add_up(self) -> RunSpec:
        if self.phases:
            total = sum(phase.tokens for phase in self.phases)
            if abs(total - self.tokens) > 1e-9 * self.tokens:
                shown = " + ".join(f"{p.tokens:.4g}" for p in self.phases)
                raise ValueError(
                    f"the phases' tokens ({shown} = {total:.4g}) must add up to tokens "
                    f"({self.tokens:.4g})"
                )
            names = [p.name for p in self.phases]
            if len(set(names)) != len(names):
                raise ValueError(f"phase names must differ: {names}")
        return self
