"""``parasim collbench``: the model's answer to nccl-tests, in nccl-tests' own table.

For each message size the chosen collective runs alone on every GPU of the cluster
(``sendrecv``: every rank sends to the next and receives from the previous, as
nccl-tests' ``sendrecv_perf`` does), through the same engine and NCCL plan a training
step uses. Rows give the size, the element count (``float``), the time, algbw =
size / time and busbw = algbw × nccl-tests' factor, and the algorithm and protocol
NCCL's cost model chose. A user checks the model against ``all_reduce_perf`` and
friends run on their own cluster; a calibration profile plugs in with ``--profile``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from simulator.common.errors import ParasimError
from simulator.common.vocabulary import CollectiveKind
from simulator.engine.collectives import (
    available_algorithms,
    bus_factor,
    plan_collective,
    plan_p2p,
)
from simulator.engine.core import EngineOptions, simulate
from simulator.schedule.ir import Collective, Program, Recv, Schedule, Send
from topologies import Cluster, build_cluster, load_cluster_spec, parse_bytes

__all__ = ["OPS", "CollbenchRow", "parse_sizes", "collbench_rows", "collbench_cluster"]


@dataclass(frozen=True)
class CollbenchRow:
    """One size of an nccl-tests-style table: the time of the collective alone, its
    algorithm and bus bandwidth (GB/s), and the algorithm and protocol NCCL would pick."""

    bytes: float
    count: int
    element_type: str
    redop: str
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    algorithm: str
    protocol: str


OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")
ELEMENT_BYTES = 4  # nccl-tests' default type, float


def parse_sizes(text: str) -> list[float]:
    """``8B-8GiB`` (powers of two from one to the other, as nccl-tests ``-f 2``) or a
    comma-separated list of sizes."""
    if "," in text or "-" not in text:
        sizes = [parse_bytes(part) for part in text.split(",") if part.strip()]
    else:
        low_text, high_text = re.split(r"\s*-\s*", text.strip(), maxsplit=1)
        low, high = parse_bytes(low_text), parse_bytes(high_text)
        if not 0 < low <= high:
            raise ParasimError(f"--sizes: need 0 < {low:g} <= {high:g} bytes in {text!r}")
        sizes, size = [], low
        while size <= high * (1 + 1e-9):
            sizes.append(size)
            size *= 2
    if not sizes or any(s <= 0 for s in sizes):
        raise ParasimError(f"--sizes: no positive sizes in {text!r}")
    return sizes


def collbench_cluster(
    preset: str, nodes: int, gpus_per_node: int | None = None, profile: str | None = None
) -> Cluster:
    config: dict[str, Any] = {"preset": preset, "nodes": nodes}
    if gpus_per_node is not None:
        config["gpus_per_node"] = gpus_per_node
    if profile is not None:
        config["profile"] = profile
    return build_cluster(load_cluster_spec(config))


def _schedule(op: str, world: int, size: float) -> Schedule:
    if op == "sendrecv":
        programs = {
            rank: Program(
                rank,
                [
                    Send(0, "send", (rank + 1) % world, size, 0),
                    Recv(1, "recv", (rank - 1) % world, size, 0),
                ],
            )
            for rank in range(world)
        }
        return Schedule(programs, {})
    programs = {
        rank: Program(rank, [Collective(0, "comm", CollectiveKind(op), "world", size)])
        for rank in range(world)
    }
    return Schedule(programs, {"world": tuple(range(world))})


def collbench_rows(
    cluster: Cluster,
    op: str,
    sizes: list[float],
    algorithm: str | None = None,
    protocol: str | None = None,
    fidelity: str = "flow",
) -> list[CollbenchRow]:
    """One row per size: the simulated time of ``op`` alone on every GPU."""
    world = cluster.num_gpus
    if world < 2:
        raise ParasimError(f"collbench needs at least 2 GPUs (the cluster has {world})")
    options = EngineOptions(fidelity, algorithm, protocol)
    if algorithm is not None and op != "sendrecv":
        available = available_algorithms(cluster, op, list(range(world)))
        if algorithm not in available:
            raise ParasimError(
                f"--algo: {op} on {world} GPUs cannot run {algorithm}; available algorithms: "
                f"{', '.join(available)}"
            )
    rows = []
    for size in sizes:
        size = float(max(ELEMENT_BYTES, round(size / ELEMENT_BYTES) * ELEMENT_BYTES))
        try:
            if op == "sendrecv":
                choice = plan_p2p(cluster, 0, 1 % world, size, protocol).choice
            else:
                choice = plan_collective(
                    cluster, op, list(range(world)), size, algorithm, protocol
                ).choice
            seconds = simulate(_schedule(op, world, size), cluster, options).step_time
        except ValueError as exc:
            raise ParasimError(f"collbench: {exc}") from None
        algbw = size / seconds
        factor = 1.0 if op == "sendrecv" else bus_factor(op, world)
        rows.append(
            CollbenchRow(
                bytes=size,
                count=int(size // ELEMENT_BYTES),
                element_type="float",
                redop="sum" if op in ("all_reduce", "reduce_scatter") else "none",
                time_s=seconds,
                algbw_GBps=algbw / 1e9,
                busbw_GBps=algbw * factor / 1e9,
                algorithm=choice.algorithm,
                protocol=choice.protocol,
            )
        )
    return rows
