"""``parasim collbench``: an nccl-tests-style table of one collective over a range of
message sizes, timed by the model, to set beside nccl-tests on a real cluster."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from simulator.cli.options import add_fidelity_option
from simulator.common.vocabulary import ALGORITHMS, COLLECTIVE_KINDS, PROTOCOLS
from simulator.tools.collbench import collbench_cluster, collbench_rows, parse_sizes

__all__ = ["COLLBENCH_OPS", "add_parser", "command"]

# every collective the IR names that moves data, and a point-to-point send/receive
COLLBENCH_OPS = (*(kind for kind in COLLECTIVE_KINDS if kind != "barrier"), "sendrecv")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim collbench`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "collbench", help="nccl-tests-style table of one collective, from the model"
    )
    parser.add_argument("--preset", required=True, help="cluster preset, e.g. dgx-h100")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, help="override the preset's")
    parser.add_argument("--op", default="all_reduce", choices=COLLBENCH_OPS)
    parser.add_argument("--sizes", default="8B-8GiB", help="8B-8GiB (doubling) or a list")
    parser.add_argument(
        "--algo",
        choices=list(ALGORITHMS),
        help="pin NCCL's algorithm",
    )
    parser.add_argument("--proto", choices=list(PROTOCOLS), help="pin NCCL's protocol")
    add_fidelity_option(parser, default="flow")
    parser.add_argument("--profile", help="calibration profile to apply to the preset")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim collbench``: print the table (or the rows as JSON)."""
    cluster = collbench_cluster(args.preset, args.nodes, args.gpus_per_node, args.profile)
    sizes = parse_sizes(args.sizes)
    rows = collbench_rows(cluster, args.op, sizes, args.algo, args.proto, args.fidelity)
    if args.json:
        keys = ("bytes", "time_s", "algbw_GBps", "busbw_GBps", "algorithm", "protocol")
        sys.stdout.write(json.dumps([{k: row[k] for k in keys} for row in rows], indent=2) + "\n")
        return 0
    out = sys.stdout
    out.write(
        f"# parasim collbench: {args.op} on {cluster.num_gpus} GPUs "
        f"({cluster.num_nodes} x {cluster.spec.name}), {args.fidelity} fidelity\n"
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
            f" {row['bytes']:>12.0f} {row['count']:>12} {row['type']:>6} {row['redop']:>6} "
            f"{row['time_s'] * 1e6:>10.2f} {row['algbw_GBps']:>7.2f} {row['busbw_GBps']:>7.2f}  "
            f"{row['algorithm']}/{row['protocol']}\n"
        )
    average = sum(row["busbw_GBps"] for row in rows) / len(rows)
    out.write(f"# Avg bus bandwidth    : {average:.3f}\n")
    return 0
