"""``parasim collbench``'s output: an nccl-tests-style table (the same columns as
``all_reduce_perf``), or the rows as JSON."""

from __future__ import annotations

import json
from typing import TextIO

from simulator.tools.collbench import CollbenchRow
from topologies import Cluster

__all__ = ["print_collbench", "collbench_json"]

_JSON_KEYS = ("bytes", "time_s", "algbw_GBps", "busbw_GBps", "algorithm", "protocol")


def collbench_json(rows: list[CollbenchRow]) -> str:
    """The rows as a JSON list (bytes, time, bandwidths, algorithm, protocol)."""
    return json.dumps([{k: getattr(row, k) for k in _JSON_KEYS} for row in rows], indent=2) + "\n"


def print_collbench(
    rows: list[CollbenchRow], op: str, cluster: Cluster, fidelity: str, out: TextIO
) -> None:
    """The table, with the average bus bandwidth at the end as nccl-tests prints it."""
    out.write(
        f"# parasim collbench: {op} on {cluster.num_gpus} GPUs "
        f"({cluster.num_nodes} x {cluster.spec.name}), {fidelity} fidelity\n"
    )
    out.write(
        f"#{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} {'algbw':>7} "
        f"{'busbw':>7}  algorithm/protocol\n"
    )
    out.write(
        f"#{'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>10} "
        f"{'(GB/s)':>7} {'(GB/s)':>7}\n"
    )
    for row in rows:
        out.write(
            f" {row.bytes:>12.0f} {row.count:>12} {row.element_type:>6} {row.redop:>6} "
            f"{row.time_s * 1e6:>10.2f} {row.algbw_GBps:>7.2f} {row.busbw_GBps:>7.2f}  "
            f"{row.algorithm}/{row.protocol}\n"
        )
    average = sum(row.busbw_GBps for row in rows) / len(rows)
    out.write(f"# Avg bus bandwidth    : {average:.3f}\n")
