"""``parasim collbench``: an nccl-tests-style table of one collective over a range of
message sizes, timed by the model, to set beside nccl-tests on a real cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from simulator.cli.options import add_fidelity_option
from simulator.common.vocabulary import (
    ALGORITHMS,
    BARRIER,
    COLLECTIVE_KINDS,
    PROTOCOLS,
)

__all__ = ["COLLBENCH_OPS", "add_parser", "command"]

# every collective the IR names that moves data, and a point-to-point send/receive
COLLBENCH_OPS = (*(kind for kind in COLLECTIVE_KINDS if kind != BARRIER), "sendrecv")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim collbench`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "collbench",
        help="nccl-tests-style table of one collective, from the model",
        description=(
            "Print the table nccl-tests would print for one collective on every GPU of a "
            "preset cluster (size, time, algbw, busbw, NCCL's algorithm and protocol), "
            "from parasim's model, to compare with the real benchmark on your machines."
        ),
    )
    parser.add_argument("--preset", required=True, help="cluster preset, e.g. dgx-h100")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument("--gpus-per-node", type=int, help="override the preset's")
    parser.add_argument(
        "--op", default="all_reduce", choices=COLLBENCH_OPS, help="collective (default all_reduce)"
    )
    parser.add_argument(
        "--sizes", default="8B-8GiB", help="8B-8GiB (doubling) or a list (default 8B-8GiB)"
    )
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
    from simulator.report.collbench_report import collbench_json, print_collbench
    from simulator.tools.collbench import collbench_cluster, collbench_rows, parse_sizes

    cluster = collbench_cluster(args.preset, args.nodes, args.gpus_per_node, args.profile)
    sizes = parse_sizes(args.sizes)
    rows = collbench_rows(cluster, args.op, sizes, args.algo, args.proto, args.fidelity)
    if args.json:
        sys.stdout.write(collbench_json(rows))
    else:
        print_collbench(rows, args.op, cluster, args.fidelity, sys.stdout)
    return 0
