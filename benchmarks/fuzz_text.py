"""Fuzzing parasim's files as text: the mutations a schema walk never makes.

:mod:`benchmarks.fuzz` changes fields of a parsed scenario; this family changes the
*bytes* of the shipped scenario files and of the files they name, as an attacker or a
careless editor would, and drives the command line the way a user does:

* **structure**: YAML nested thousands of levels deep, multi-megabyte values and lists,
  anchor-and-alias bombs, duplicated keys, lines deleted, duplicated, re-indented or
  cut short, a byte-order mark, CR line ends, invalid UTF-8;
* **numbers**: a number of the file replaced by a huge or odd one (thousands of digits,
  ``1e309``, ``.nan``, ``0x…``, ``1_000``), a cluster field (``cluster.gpu.*``,
  ``cluster.nic.*``…) given an odd value or unit (``1e-300 TFLOP/s``, ``-5 GB/s``,
  ``5 parsecs``), rows of ``cluster.gpu.gemm_table`` with zero, negative, huge or
  missing entries;
* **terminal**: keys and values holding escape sequences and other control characters,
  which a message must never print raw;
* **named files**: a calibration profile (``cluster.profile``) and a custom topology
  (``cluster.topology``) mutated the same ways, JSON bombs included;
* **output folders**: ``parasim run --out DIR`` where ``DIR`` already holds files of
  the user's (plain, hidden, nested, named as parasim's outputs, symlinks to files and
  folders elsewhere, dangling symlinks), each of which must survive untouched.

Every case must end in a result whose invariants hold (:func:`benchmarks.fuzz.violations`)
or in one line on stderr with exit status 2 that holds no control character and no more
than :data:`LONGEST_MESSAGE` characters. Anything else is counted: a *traceback*, an
*invariant* violation, a *multi-line* or *unsafe-message* error, a *lost-file*, or a
*timeout* (over :data:`CASE_LIMIT_S` seconds, the bound a user waits for a scenario to be
read or refused).

``python -m benchmarks.fuzz --family text --cases 3000`` runs the family.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.fuzz_tally import Tally, traceback_detail

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

#: The seconds a case may take: a file is read or refused well within it.
CASE_LIMIT_S = 10.0
#: The longest error line a terminal should receive.
LONGEST_MESSAGE = 1000

BASES = (
    "small.yaml",
    "pipeline-demo.yaml",
    "cpu-tiny.yaml",
    "teaching/moe-imbalance-mistake.yaml",
    "teaching/sp-memory-fix.yaml",
    "teaching/tp-across-nodes-fix.yaml",
    "teaching/cp-across-nodes-fix.yaml",
    "teaching/layering-fix.yaml",
)

OUTCOMES = (
    "result",
    "error",
    "traceback",
    "invariant",
    "multi-line",
    "unsafe-message",
    "lost-file",
    "timeout",
)
FAILURES = OUTCOMES[2:]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NUMBER = re.compile(r"(?<=[:\[, ])(\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?=\s*(?:[,\]}#\n]|$))", re.M)

ODD_NUMBERS = (
    "1" * 4301,
    "9" * 400,
    "18446744073709551617",
    "1e309",
    "-1e309",
    "1e-400",
    "1e300",
    "0",
    "-1",
    "-0.0",
    ".nan",
    ".inf",
    "-.inf",
    "0x7fffffff",
    "0o777",
    "1_000_000",
    "0b101",
    "1:30",
    "~",
    "2.5",
    "1e18",
)
ODD_UNIT_VALUES = (
    '"1e-300 TFLOP/s"',
    '"1e300 TFLOP/s"',
    '"-5 GB/s"',
    '"0 GB/s"',
    '"1e400 GB/s"',
    '"nan GB/s"',
    '"inf GB/s"',
    '"5 parsecs"',
    '"450 gb/s"',
    '"12 GB/s/s"',
    '"1e-30 us"',
    '"-3 us"',
    '"1e30 s"',
    '"80 GiB"',
    '"1e-30 GiB"',
    '"0.000001 B"',
    '"450"',
    "450",
    "1e-300",
    "1e300",
    "0",
    "-1",
    ".nan",
    "[1, 2]",
    "{a: 1}",
    "''",
    "true",
    "null",
    '"' + "9" * 5000 + ' GB/s"',
)
CLUSTER_FIELDS = (
    "gpu.peak_flops",
    "gpu.fp8_peak_flops",
    "gpu.hbm_bandwidth",
    "gpu.hbm_capacity",
    "gpu.matmul_efficiency",
    "gpu.attention_efficiency",
    "gpu.kernel_launch_overhead",
    "gpu.hbm_efficiency",
    "gpu.sm_count",
    "gpu.gemm_tile",
    "gpu.gemm_k_overhead",
    "gpu.jitter",
    "gpu.devices_per_core",
    "nvswitch.bandwidth",
    "nvswitch.latency",
    "nic.bandwidth",
    "nic.latency",
    "nic.count",
    "nic.pcie_bandwidth",
    "network.switch_latency",
    "network.oversubscription",
    "network.pod_size",
    "nodes",
    "gpus_per_node",
)
GEMM_CELLS = (
    "4096",
    "0",
    "-64",
    "1e300",
    "1e-300",
    "0.5",
    "-0.5",
    "0.0",
    "1.5",
    ".nan",
    ".inf",
    '"x"',
    "[]",
    "null",
    "9" * 400,
)
ESCAPES = (
    "\x1b]0;PWNED\x07",
    "\x1b[2J",
    "\x1b[31mred\x1b[0m",
    "\x07",
    "\x7f",
    "\x9b31m",
    "\r",
    "\u202e",
    "\x08\x08\x08",
)

PROFILE = {
    "format": "parasim-calibration",
    "version": 1,
    "created": "2026-01-01T00:00:00Z",
    "device": {"name": "A100", "type": "cuda", "count": 8, "per_node": 8, "nodes": 1},
    "software": {"torch": "2.13.0", "backend": "nccl"},
    "gpu": {
        "peak_flops": 3.12e14,
        "matmul_efficiency": 0.7,
        "attention_efficiency": 0.5,
        "kernel_launch_overhead": 5e-6,
        "hbm_bandwidth": 2e12,
        "gemm_table": [[4096, 4096, 4096, 0.78], [1024, 1024, 1024, 0.6]],
    },
    "comm": {
        "all_reduce": {
            "intra_node": {"alpha": 2e-5, "bandwidth": 2e11, "rms_residual_s": 1e-6, "points": 8}
        }
    },
}
#: Where a case's files lie, in the text of a mutated file (replaced by the case's folder).
WORK = "@WORK@"
TOPOLOGY = (ROOT / "topologies" / "examples" / "switch-ring-2d.yaml").read_text()


@dataclass(frozen=True)
class TextCase:
    """A base scenario, the mutation applied to it and the seed that drew its details."""

    base: str
    mutation: str
    seed: int

    def describe(self) -> str:
        return f"scenarios/{self.base} {self.mutation} (seed {self.seed})"


# ------------------------------------------------------------------------ mutations


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _set_cluster_field(text: str, dotted: str, value: str) -> str:
    """The scenario with ``cluster.<dotted>: value`` added under its ``cluster:`` block."""
    parts = dotted.split(".")
    block = "".join(f"{'  ' * (i + 1)}{part}:\n" for i, part in enumerate(parts[:-1]))
    leaf = f"{'  ' * len(parts)}{parts[-1]}: {value}\n"
    return re.sub(
        r"^cluster:[^\n]*\n",
        lambda m: _block_cluster(m.group(0)) + block + leaf,
        text,
        count=1,
        flags=re.M,
    )


def _block_cluster(line: str) -> str:
    """``cluster: {preset: x, nodes: 2}`` as a block mapping's first lines."""
    inline = re.match(r"cluster:\s*\{(.*)\}\s*$", line.strip())
    if not inline:
        return line
    items = [item.strip() for item in inline.group(1).split(",") if item.strip()]
    return "cluster:\n" + "".join(f"  {item}\n" for item in items)


def deep_nesting(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    depth = rng.choice((60, 500, 3000, 20000))
    style = rng.choice(("flow-list", "flow-map", "block"))
    if style == "flow-list":
        junk = "[" * depth + "1" + "]" * depth
    elif style == "flow-map":
        junk = "{a: " * depth + "1" + "}" * depth
    else:
        depth = min(depth, 3000)
        junk = (
            "\n"
            + "".join(f"{' ' * (i + 1)}k{i}:\n" for i in range(depth))
            + " " * (depth + 1)
            + "1"
        )
    where = rng.choice(("junk", "description", "gemm"))
    if where == "gemm":
        return _set_cluster_field(text, "gpu.gemm_table", junk if style != "block" else "[]"), {}
    return re.sub(r"^description:.*$", "", text, flags=re.M) + f"\n{where}: {junk}\n", {}


def huge_value(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    size = rng.choice((10_000, 200_000, 2_000_000, 10_000_000))
    key = rng.choice(("name", "description"))
    value = "x" * size
    return re.sub(rf"^{key}:.*$", lambda m: f"{key}: {value}", text, count=1, flags=re.M), {}


def long_list(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    entries = rng.choice((1000, 100_000, 1_000_000))
    if rng.random() < 0.5:
        return text + "\njunk: [" + ", ".join(["0"] * entries) + "]\n", {}
    return text + "\njunk:\n" + "- 0\n" * entries, {}


def gemm_rows(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    rows = rng.choice((1, 3, 300, 300_000))
    cells = [rng.choice(GEMM_CELLS) for _ in range(4)]
    if rng.random() < 0.3:
        cells = cells[: rng.choice((0, 2, 3))] + (["7"] * rng.choice((0, 2)))
    odd = "[" + ", ".join(cells) + "]"
    normal = "[4096, 4096, 4096, 0.7]"
    listing = [normal] * (rows - 1) + [odd]
    rng.shuffle(listing)
    return _set_cluster_field(text, "gpu.gemm_table", "[" + ", ".join(listing) + "]"), {}


def odd_field(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    field = rng.choice(CLUSTER_FIELDS)
    value = rng.choice(ODD_UNIT_VALUES + ODD_NUMBERS[:6])
    if field in ("nodes", "gpus_per_node") and re.search(rf"\b{field}:", text):
        return re.sub(rf"\b{field}: *[^,}}\n]+", f"{field}: {value}", text, count=1), {}
    return _set_cluster_field(text, field, value), {}


def huge_number(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    spots = list(_NUMBER.finditer(text))
    if not spots:
        return text, {}
    spot = rng.choice(spots)
    return text[: spot.start()] + rng.choice(ODD_NUMBERS) + text[spot.end() :], {}


def yaml_bomb(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    width, levels = rng.choice(((9, 9), (10, 7), (4, 12), (2, 30)))
    lines = ['b0: &b0 ["lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"b{level}: &b{level} [" + ", ".join([f"*b{level - 1}"] * width) + "]")
    where = rng.choice(("junk", "gemm"))
    anchors = "bombs:\n" + "".join(f"  {line}\n" for line in lines)
    if where == "gemm":
        return _set_cluster_field(anchors + text, "gpu.gemm_table", f"*b{levels - 1}"), {}
    return anchors + text + f"\njunk: *b{levels - 1}\n", {}


def duplicate_key(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    lines = _lines(text)
    keyed = [i for i, line in enumerate(lines) if re.match(r"^\s*\w+:\s*\S", line)]
    if not keyed:
        return text, {}
    i = rng.choice(keyed)
    line = lines[i]
    other = re.sub(r":\s*\S.*$", ": " + rng.choice(("1", "2", "64", "x", "true")), line.rstrip())
    lines.insert(i + 1, other + "\n")
    return "".join(lines), {}


def control_chars(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    escape = rng.choice(ESCAPES)
    where = rng.choice(("key", "value", "name", "preset", "field"))
    quoted = json.dumps(f"{escape}x{escape}")
    if where == "key":
        return text + f"\n{quoted}: 1\n", {}
    if where == "value":
        return text + f"\nparallel_junk: {quoted}\n", {}
    if where == "name":
        return re.sub(r"^name:.*$", lambda m: f"name: {quoted}", text, count=1, flags=re.M), {}
    if where == "preset":
        return re.sub(r"preset: *[\w.-]+", lambda m: f"preset: {quoted}", text, count=1), {}
    return _set_cluster_field(text, "gpu.peak_flops", quoted), {}


def line_edit(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    lines = _lines(text)
    kind = rng.choice(("delete", "duplicate", "indent", "truncate", "swap", "tab", "bom", "crlf"))
    i = rng.randrange(len(lines))
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(i, lines[i])
    elif kind == "indent":
        lines[i] = " " * rng.choice((1, 3, 8)) + lines[i]
    elif kind == "truncate":
        return text[: rng.randrange(len(text))], {}
    elif kind == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "tab":
        lines[i] = "\t" + lines[i]
    elif kind == "bom":
        return "\ufeff" + text, {}
    else:
        return text.replace("\n", "\r\n" if rng.random() < 0.5 else "\r"), {}
    return "".join(lines), {}


def invalid_utf8(rng: random.Random, text: str) -> tuple[bytes, dict[str, bytes]]:
    data = text.encode()
    at = rng.randrange(len(data))
    return data[:at] + rng.choice((b"\xff", b"\xc3\x28", b"\x00", b"\xed\xa0\x80")) + data[at:], {}


def _profile_text(rng: random.Random) -> bytes:
    profile = json.loads(json.dumps(PROFILE))
    kind = rng.choice(("field", "gemm", "op_table", "comm", "nesting", "huge", "array", "nan"))
    odd: Any = rng.choice((0, -1, 1e300, -1e-300, None, "x", [], {}, True, 10**400, 2**70))
    if kind == "field":
        section, key = rng.choice(
            [("gpu", k) for k in PROFILE["gpu"]]
            + [("device", k) for k in PROFILE["device"]]
            + [("", "format"), ("", "version"), ("", "created"), ("software", "torch")]
        )
        (profile[section] if section else profile)[key] = odd
    elif kind == "gemm":
        row = [4096, 4096, 4096, 0.7]
        row[rng.randrange(4)] = odd
        profile["gpu"]["gemm_table"] = [row] * rng.choice((1, 1000, 300_000))
    elif kind == "op_table":
        entry = {"kind": "gemm", "flops": 1e12, "bytes": 1e8, "seconds": 1e-3}
        entry[rng.choice(list(entry))] = odd
        profile["gpu"]["op_table"] = [entry]
    elif kind == "comm":
        fit = profile["comm"]["all_reduce"]["intra_node"]
        fit[rng.choice(list(fit) + ["table"])] = odd
    elif kind == "nesting":
        depth = rng.choice((100, 5000, 100_000))
        return (json.dumps(profile)[:-1] + ', "junk": ' + "[" * depth + "]" * depth + "}").encode()
    elif kind == "huge":
        profile["software"]["torch"] = "x" * rng.choice((100_000, 10_000_000))
    elif kind == "array":
        return rng.choice((b"[]", b"[1, 2]", b"null", b'"x"', b"1e999", b""))
    else:
        text = json.dumps(profile).replace("0.7", rng.choice(("NaN", "Infinity", "-Infinity")))
        return text.encode()
    return json.dumps(profile).encode()


def profile_file(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    text = _set_cluster_field(text, "profile", f"{WORK}/prof.json")
    return text, {"prof.json": _profile_text(rng)}


def topology_file(rng: random.Random, text: str) -> tuple[str, dict[str, bytes]]:
    topology = TOPOLOGY
    mutator = rng.choice((huge_number, duplicate_key, line_edit, deep_nesting, yaml_bomb))
    mutated, _ = mutator(rng, topology)
    base = "name: topo\ncluster: {topology: topo.yaml}\nmodel: {preset: gpt2-small}\n"
    base += "training: {global_batch: 16, micro_batch: 2}\nparallel: {tp: 2, pp: 2}\n"
    return base, {"topo.yaml": mutated.encode() if isinstance(mutated, str) else mutated}


MUTATIONS: dict[str, Callable[[random.Random, str], tuple[Any, dict[str, bytes]]]] = {
    "deep-nesting": deep_nesting,
    "huge-value": huge_value,
    "long-list": long_list,
    "gemm-rows": gemm_rows,
    "odd-field": odd_field,
    "huge-number": huge_number,
    "yaml-bomb": yaml_bomb,
    "duplicate-key": duplicate_key,
    "control-chars": control_chars,
    "line-edit": line_edit,
    "invalid-utf8": invalid_utf8,
    "profile-file": profile_file,
    "topology-file": topology_file,
    "output-folder": lambda rng, text: (text, {}),
}
#: How often each mutation is drawn (the output folder's cases each run a command).
WEIGHTS = {name: 1.0 for name in MUTATIONS}


def random_text_case(rng: random.Random) -> TextCase:
    names = list(MUTATIONS)
    mutation = rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
    return TextCase(rng.choice(BASES), mutation, rng.randrange(2**32))


# ------------------------------------------------------------------- running a case


def message_problem(message: str) -> str | None:
    """What is wrong with an error line a terminal would receive, or None."""
    text = message.rstrip("\n")
    if "\n" in text:
        return "multi-line"
    if _CONTROL.search(text) or len(text) > LONGEST_MESSAGE:
        return "unsafe-message"
    return None


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """Run ``parasim argv`` in this process: (exit status, stdout, stderr)."""
    from simulator.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _plant(rng: random.Random, folder: Path, elsewhere: Path) -> dict[str, Any]:
    """Plant files of the user's in ``folder``; what each path must still hold."""
    names = [
        "photo.png",
        "diagram.svg",
        "images/fig1.jpg",
        "hta/precious.jpg",
        "ranks/precious.jpg",
        ".env.personal",
        ".bashrc.20240101",
        "sweep.csv",
        "compare.json",
        "measured.json",
        ".thesis.tmp.docx",
        "notes.txt",
        "result.json",
        "report.html",
        "timeline.html",
        "trace.json",
        "trace.json.gz",
        "plotly.min.js",
        ".parasim",
        "deep/a/b/c.txt",
        ".result.json.abcdefgh",
    ]
    planted: dict[str, Any] = {}
    for name in rng.sample(names, rng.randint(1, 6)):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        content = f"user data {rng.random()}"
        path.write_text(content)
        planted[name] = content
    (elsewhere / "keep.txt").write_text("outside")
    planted["<elsewhere>/keep.txt"] = "outside"
    if rng.random() < 0.6:
        link = rng.choice(("hta", "images", "link-dir", "report.html", "result.json", "ranks"))
        target = rng.choice((elsewhere, elsewhere / "keep.txt", elsewhere / "missing"))
        path = folder / link
        if not path.exists() and not path.is_symlink():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(target)
            planted[link] = ("symlink", str(target))
    return planted


def _survivors(folder: Path, elsewhere: Path, planted: dict[str, Any]) -> list[str]:
    lost = []
    for name, expected in planted.items():
        path = elsewhere / "keep.txt" if name.startswith("<elsewhere>") else folder / name
        if isinstance(expected, tuple):
            if not path.is_symlink() or os.readlink(path) != expected[1]:
                lost.append(name)
        elif not path.is_file() or path.is_symlink() or path.read_text() != expected:
            lost.append(name)
    return lost


def _output_folder_case(rng: random.Random, base: Path, work: Path) -> tuple[str, str]:
    folder, elsewhere = work / "out", work / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    planted = _plant(rng, folder, elsewhere)
    outputs = rng.choice(("result", "result", "result,timeline", "result,trace,timeline,report"))
    argv = ["run", str(base), "--fidelity", "analytic", "--outputs", outputs, "--out", str(folder)]
    if rng.random() < 0.3:
        argv.append("--hta")
    code, _, err = _cli(argv)
    lost = _survivors(folder, elsewhere, planted)
    if lost:
        return "lost-file", f"exit {code}; lost {', '.join(sorted(lost))}"
    if code not in (0, 2):
        return "traceback", err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
    if code == 2:
        problem = message_problem(err)
        return (problem, err[:300]) if problem else ("error", err.strip())
    return "result", ""


def run_text_case(case: TextCase, seconds: float = CASE_LIMIT_S) -> tuple[str, str]:
    """``(outcome, detail)`` of one case (:data:`OUTCOMES`)."""
    from benchmarks.fuzz import CaseTimeout, time_limit, violations
    from simulator.common.errors import ParasimError
    from topologies import TopologyError

    rng = random.Random(case.seed)
    base = SCENARIOS / case.base
    work = Path(tempfile.mkdtemp(prefix="parasim-fuzz-"))
    try:
        with time_limit(seconds):
            if case.mutation == "output-folder":
                return _output_folder_case(rng, base, work)
            text, files = MUTATIONS[case.mutation](rng, base.read_text())
            data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
            data = data.replace(WORK.encode(), str(work).encode())
            (work / "scenario.yaml").write_bytes(data)
            for name, content in files.items():
                (work / name).write_bytes(content)
            return _load_and_run(work / "scenario.yaml", violations)
    except CaseTimeout:
        return "timeout", f"over {seconds:g} s"
    except (ParasimError, TopologyError) as exc:
        message = f"parasim: error: {_shown(exc)}"
        problem = message_problem(message)
        return (problem, message[:300]) if problem else ("error", message)
    except RecursionError:
        return "traceback", "RecursionError"
    except Exception as exc:  # noqa: BLE001 - a traceback is what is being counted
        return "traceback", traceback_detail(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _shown(exc: BaseException) -> str:
    """The message as the command line prints it."""
    try:
        from simulator.cli.main import error_line
    except ImportError:
        return str(exc)
    return error_line(exc)


def _load_and_run(path: Path, violations: Callable[[Any], list[str]]) -> tuple[str, str]:
    from simulator.request.scenario import load_scenario
    from simulator.run.simulate import run_scenario

    scenario = load_scenario(str(path), [])
    run = run_scenario(scenario)
    broken = violations(run)
    if broken:
        return "invariant", "; ".join(broken)
    return "result", ""


def run_family(cases: int, seed: int, examples: int, limit: float | None = None) -> int:
    """Run ``cases`` text cases and print the counts; 1 when any failed."""
    limit = CASE_LIMIT_S if limit is None else limit
    rng = random.Random(seed)
    tally = Tally(OUTCOMES, FAILURES, list(MUTATIONS), examples)
    slow: list[tuple[float, str]] = []
    started = time.perf_counter()
    for index in range(cases):
        if index and index % 250 == 0:
            print(f"  ... {index} cases, {time.perf_counter() - started:.0f} s", flush=True)
        case = random_text_case(rng)
        begun = time.perf_counter()
        outcome, detail = run_text_case(case, limit)
        if time.perf_counter() - begun > limit:
            slow.append((time.perf_counter() - begun, case.describe()))
        tally.add(case.describe(), case.mutation, outcome, detail)
    wall = time.perf_counter() - started
    tally.print_counts(
        f"{cases} text cases (seed {seed}) in {wall:.0f} s", [f"  past {limit:g} s     {len(slow)}"]
    )
    tally.print_examples()
    return 1 if tally.failed else 0
