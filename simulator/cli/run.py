"""``parasim run``: simulate one training step of a scenario, print a summary and write
``result.json``, ``trace.json``, ``timeline.html`` and ``report.html`` (with ``--hta``
one trace per rank, with ``--image`` the report's charts as images)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from simulator.cli.options import add_fidelity_option, add_outputs_option, add_set_option
from simulator.common.collector import fewer_collections
from simulator.common.folders import folder_argument

__all__ = ["add_parser", "command", "EXIT_OOM"]

#: The exit status of a run whose step does not fit in memory (2 is bad input).
EXIT_OOM = 3


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim run`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "run",
        help="simulate one training step of a scenario",
        description=(
            "Simulate one training step of a scenario: print a summary and write "
            "result.json, trace.json, timeline.html and report.html (or those --outputs "
            "names) to the output folder, the pages beside one plotly.min.js."
        ),
    )
    parser.add_argument("scenario", help="scenario YAML file")
    add_set_option(parser)
    add_fidelity_option(
        parser,
        default=None,
        help="simulation fidelity, as --set simulation.fidelity=... (default: the scenario's)",
    )
    parser.add_argument(
        "--out", type=folder_argument, help="output folder (default: out/<scenario name>)"
    )
    add_outputs_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="print result.json on stdout instead of the summary"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="simulate a step even when it looks too large for this machine's memory",
    )
    parser.add_argument(
        "--allow-oom",
        action="store_true",
        help=f"exit 0 when the step does not fit in the GPUs' memory (by default the files "
        f"are written, the summary leads with it and the exit status is {EXIT_OOM})",
    )
    parser.add_argument(
        "--hta",
        action="store_true",
        help="also write hta/, one trace file per rank for Holistic Trace Analysis",
    )
    parser.add_argument(
        "--full-trace",
        action="store_true",
        help="trace.json and timeline.html show every simulated rank (by default a large "
        "step keeps representative ranks, and a deep pipeline 16 of its stages)",
    )
    parser.add_argument(
        "--image",
        choices=["png", "svg"],
        help="also write the report's charts as static images (needs kaleido and Chromium; "
        "BROWSER_PATH picks the browser)",
    )
    return parser


@fewer_collections(last=True)
def command(args: argparse.Namespace) -> int:
    """Run ``parasim run``: simulate, write the outputs, print the summary (or JSON)."""
    from simulator.common.files import dumps_result
    from simulator.common.folders import check_folder, default_folder, staged_folder
    from simulator.report.outputs import names_ops, run_output_names, write_run_outputs
    from simulator.report.progress import Status, interactive
    from simulator.report.summary import out_of_memory_line, show_summary, summarise
    from simulator.request.scenario import load_scenario
    from simulator.run.simulate import check_request_size, run_scenario

    if args.image:
        from simulator.report.images import check_requirements

        check_requirements()  # before the simulation, not after it
    if args.fidelity is not None:
        args.overrides = [*args.overrides, f"simulation.fidelity={args.fidelity}"]
    if not args.force:  # before loading lays out every rank (seconds for a million GPUs)
        check_request_size(args.scenario, args.overrides)
    scenario = load_scenario(args.scenario, args.overrides)
    out = args.out if args.out is not None else default_folder(scenario.name, "", args.overrides)
    names = run_output_names(args.outputs, args.hta, args.image)
    check_folder(out, names=names)  # before the simulation, not after it
    fidelity = scenario.spec.simulation.fidelity
    with Status(f"simulating {scenario.name} ({fidelity})", interactive(args.json)) as status:
        labelled = names_ops(args.outputs, args.hta, args.image)
        run = run_scenario(scenario, force=args.force, labelled=labelled)
        run.result.overrides = list(args.overrides)
        if scenario.spec.run is not None and "report" in args.outputs:
            # the report shows the scenario's whole run (only then: plotly and the plan)
            from simulator.tools.plan import plan_run

            status.update("planning the whole run (run:)")
            run.plan = plan_run(args.scenario, args.overrides, run.result)
        status.update(f"writing {', '.join(args.outputs)}")
        with staged_folder(out, "parasim run", names) as stage:
            written = write_run_outputs(
                run,
                stage,
                title=f"{scenario.name}: one training step",
                image_format=args.image,
                hta=args.hta,
                outputs=args.outputs,
                full_trace=args.full_trace,
            )
    paths = [out / path.relative_to(stage) for path in written]
    if args.json:
        sys.stdout.write(dumps_result(run.result.to_json()))
    else:
        plan = None
        if run.plan is not None:
            from simulator.report.plan_report import plan_lines

            plan = plan_lines(run.plan)
        show_summary(summarise(run.result, [str(p) for p in paths], plan))
    oom = out_of_memory_line(run.result)
    if oom is not None and not args.allow_oom:
        print(f"parasim: {oom} (--allow-oom to exit 0)", file=sys.stderr)
        return EXIT_OOM
    return 0
