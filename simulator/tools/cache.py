"""Results of a search's candidates kept on disk, so that a rerun simulates only what is
new, and never serves an outcome its inputs no longer give.

A sweep checks and simulates each candidate layout from the scenario's raw dict and
the candidate's ``--set`` overrides. :class:`ResultCache` keys each outcome by a hash
of everything it depends on:

* what was computed (``check`` or ``simulate``);
* the candidate's whole scenario (the raw dict, the user's ``--set`` overrides already
  applied, and the candidate's overrides);
* the contents of every file that scenario names (a calibration profile
  ``cluster.profile``, a custom topology ``cluster.topology``, a pipeline order
  ``parallel.schedule_file``), however named: a relative name is looked up in every
  place a loader may read it from (the scenario's folder, the working directory and,
  for a topology, parasim's ``topologies/`` package), and the key holds the contents
  found in each of them, in that order (:func:`named_files`). Editing, adding or
  removing any file a run could read is a miss;
* parasim's version and a fingerprint of its own code and presets (a hash of every
  source and preset file of ``simulator`` and ``topologies``), so a changed model
  never serves an old number.

Each outcome is one small JSON file, ``<folder>/<key[:2]>/<key>.json``, written
atomically: concurrent sweeps sharing a folder never read half a file. An entry is
checked when it is read (:data:`ENTRY_SCHEMAS`: every field a search uses, of its type,
numbers finite and positive where they must be): one that is not JSON, not of its
kind's schema, or larger than :data:`LARGEST_ENTRY`, is a miss, computed afresh and
written over. Nothing is ever evicted; delete the folder to start afresh. ``parasim
sweep --cache DIR`` names the folder, ``--no-cache`` turns it off; by default it is
``.parasim-cache`` beside the output folder. The cache writes only its entries (and,
to check that the folder can be written, a temporary file of its own) and removes
nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from simulator.analysis.metrics import CATEGORIES
from simulator.common.errors import ParasimError
from simulator.common.files import write_atomically
from simulator.common.version import __version__
from simulator.request.scenario import apply_overrides

__all__ = [
    "DEFAULT_CACHE_NAME",
    "ENTRY_SCHEMAS",
    "FILE_FIELDS",
    "LARGEST_ENTRY",
    "ResultCache",
    "code_fingerprint",
    "named_files",
]

#: The default cache folder's name, beside the output folder.
DEFAULT_CACHE_NAME = ".parasim-cache"

#: The scenario fields that name a file whose content decides the outcome.
FILE_FIELDS = ("cluster.profile", "cluster.topology", "parallel.schedule_file")
# where a relative name of each field may be read from, in the order its loader looks
# (topologies.custom.find_topology_file; request.scenario's _recipe for the schedule;
# topologies.build reads a profile as named, from the working directory): every place
# any loader looks is hashed, so the key holds whatever file the run reads
_SCENARIO_FOLDER, _WORKING_FOLDER, _PACKAGE_FOLDER = "scenario", "cwd", "package"
_LOOKUP = {
    "cluster.profile": (_WORKING_FOLDER, _SCENARIO_FOLDER),
    "cluster.topology": (_SCENARIO_FOLDER, _WORKING_FOLDER, _PACKAGE_FOLDER),
    "parallel.schedule_file": (_SCENARIO_FOLDER, _WORKING_FOLDER),
}
_PACKAGE = Path(__file__).resolve().parents[2] / "topologies"

#: The largest entry read (bytes): an outcome is a few hundred bytes, a simulated one
#: with its warnings a few kilobytes.
LARGEST_ENTRY = 1 << 20


# -- what an entry must hold ---------------------------------------------------------


class _Entry(BaseModel):
    """An outcome as stored: exactly these fields, of these JSON types, numbers finite."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


_Positive = Annotated[float, Field(gt=0)]
_NonNegative = Annotated[float, Field(ge=0)]
_Count = Annotated[int, Field(ge=1)]


class _Invalid(_Entry):
    """A candidate the scenario validator refused (``check``)."""

    status: Literal["invalid"]
    reason: str


class _Failed(_Entry):
    """A candidate whose simulation ended in an error (``simulate``)."""

    status: Literal["failed"]
    reason: str


class _Checked(_Entry):
    """A valid candidate's memory estimate: it ``fits`` or is ``pruned``."""

    status: Literal["fits", "pruned"]
    peak_bytes_per_gpu: _Positive
    capacity_bytes: _Positive
    dominant_term: str


class _Breakdown(_Entry):
    """The mean time of each category (:data:`simulator.analysis.metrics.CATEGORIES`)."""

    compute: _NonNegative
    exposed_comm: _NonNegative
    bubble: _NonNegative
    imbalance_stall: _NonNegative
    other: _NonNegative


assert tuple(_Breakdown.model_fields) == CATEGORIES


class _Simulated(_Entry):
    """The headline numbers of a simulated candidate
    (:func:`simulator.tools.sweep.simulate_overrides`)."""

    status: Literal["simulated"]
    step_time_s: _Positive
    tokens_per_s: _Positive
    tflops_per_gpu: _Positive
    # above 1 only where causal attention's full count passes the peak (a warning says so)
    mfu: _Positive
    microbatches: _Count
    global_batch: _Count
    peak_bytes_per_gpu: _Positive
    capacity_bytes: _Positive
    memory_fraction: _Positive
    oom: bool
    dominant_memory_term: str
    breakdown_mean_s: _Breakdown
    bubble_fraction: _NonNegative
    exposed_comm_fraction: _NonNegative
    stall_fraction: _NonNegative
    warnings: list[str]
    # the trust interval's multipliers on the step time (simulator.analysis.trust)
    interval: dict[str, Any] | None = None


#: What an entry of each kind must be to be read.
ENTRY_SCHEMAS: dict[str, TypeAdapter] = {
    "check": TypeAdapter(Annotated[_Invalid | _Checked, Field(discriminator="status")]),
    "simulate": TypeAdapter(Annotated[_Failed | _Simulated, Field(discriminator="status")]),
}


def valid_entry(kind: str, value: Any) -> bool:
    """Whether ``value`` (parsed JSON) is an outcome of ``kind`` a search can use."""
    try:
        ENTRY_SCHEMAS[kind].validate_python(value)
    except ValidationError:
        return False
    return True


# -- what the key holds ----------------------------------------------------------------


@functools.cache
def code_fingerprint() -> str:
    """A hash of parasim's version and of every source and preset file of the
    ``simulator`` and ``topologies`` packages, in path order."""
    digest = hashlib.sha256(__version__.encode())
    root = Path(__file__).resolve().parents[2]
    for package in ("simulator", "topologies"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".yaml", ".yml", ".json") and path.is_file():
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def _contents(path: Path) -> str | None:
    """The SHA-256 of the file at ``path``; None where there is no readable file."""
    try:
        if not path.is_file():
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _places(field: str, name: str, base_dir: str) -> list[Path]:
    """Every path a loader may read ``name`` of ``field`` from."""
    path = Path(name)
    if path.is_absolute():
        return [path]
    folders = {
        _SCENARIO_FOLDER: Path(base_dir),
        _WORKING_FOLDER: Path.cwd(),
        _PACKAGE_FOLDER: _PACKAGE,
    }
    return [folders[where] / path for where in _LOOKUP[field]]


def _field(raw: dict[str, Any], dotted: str) -> Any:
    section, name = dotted.split(".")
    values = raw.get(section)
    return values.get(name) if isinstance(values, dict) else None


def named_files(raw: dict[str, Any], base_dir: str) -> dict[str, list[str | None]]:
    """For each field of :data:`FILE_FIELDS` that names a file in ``raw``: the contents
    (SHA-256) of every place a loader may read it from, in order, None where there is
    no file (an inline topology mapping is part of the scenario itself)."""
    files = {}
    for dotted in FILE_FIELDS:
        name = _field(raw, dotted)
        if isinstance(name, str) and name:
            files[dotted] = [_contents(path) for path in _places(dotted, name, base_dir)]
    return files


def _names_a_file(override: str) -> bool:
    """Whether an override (``key.path=value``) may change a field of :data:`FILE_FIELDS`:
    it sets the field, a section holding it, or a key inside it."""
    key = override.split("=", 1)[0].strip()
    return any(
        key == field or field.startswith(key + ".") or key.startswith(field + ".")
        for field in FILE_FIELDS
    )


class ResultCache:
    """Outcomes of candidates on disk (``folder`` None: no cache, every lookup misses).

    ``hits`` counts the entries read and used; ``rejected`` those found but refused
    (not JSON, or not of their kind's schema), each then computed afresh and written
    over; ``unwritten`` those the disk refused to keep."""

    def __init__(self, folder: str | Path | None):
        self.folder = Path(folder) if folder is not None else None
        self.hits = 0
        self.rejected = 0
        self.unwritten = 0

    def check(self) -> None:
        """Refuse a folder the cache cannot keep its entries in, in one line, before a
        search starts: not a folder, or one that cannot be made or written."""
        if self.folder is None:
            return
        if self.folder.exists() and not self.folder.is_dir():
            raise ParasimError(f"--cache: {self.folder} is not a folder")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=".parasim-probe-", dir=self.folder)
            os.close(handle)
            os.unlink(probe)  # a name of its own, never one of the user's
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            where = f"--cache: cannot keep outcomes in {self.folder}"
            raise ParasimError(f"{where} ({reason})") from None

    def key(
        self,
        kind: str,
        raw: dict[str, Any],
        base_dir: str,
        overrides: list[str],
        base: str | None = None,
        files: dict[tuple[str, ...], dict[str, list[str | None]]] | None = None,
        forced: bool = False,
    ) -> str:
        """The key of ``kind`` (``check``, ``simulate``) of one candidate: the base
        scenario (``base``: its canonical JSON, when already made), the overrides as
        given (parsing thousands of them would cost more than the lookups save), and
        the contents of the files the candidate's scenario names (the overrides are
        applied first where one may name a file). ``files`` remembers the contents by
        the names, for the keys of one search (its files do not change while it runs).
        ``forced`` (a search past the size guard) keys apart: the guard's refusals of a
        search that was not forced are outcomes too."""
        named = apply_overrides(raw, overrides) if any(map(_names_a_file, overrides)) else raw
        names = (base_dir, *(json.dumps(_field(named, f), default=str) for f in FILE_FIELDS))
        files = {} if files is None else files
        if names not in files:
            files[names] = named_files(named, base_dir)
        payload = json.dumps(
            {
                **({"forced": True} if forced else {}),
                "kind": kind,
                "scenario": base or json.dumps(raw, sort_keys=True, default=str),
                "overrides": overrides,
                "files": files[names],
                "code": code_fingerprint(),
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str, kind: str) -> dict[str, Any] | None:
        """The entry of ``key`` if there is one and it is a valid outcome of ``kind``
        (:func:`valid_entry`); None otherwise."""
        if self.folder is None:
            return None
        path = self._path(key)
        try:
            if path.stat().st_size > LARGEST_ENTRY:
                self.rejected += 1
                return None
            value = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON
            self.rejected += 1
            return None
        if not valid_entry(kind, value):
            self.rejected += 1
            return None
        self.hits += 1
        return value

    def put(self, key: str, value: dict[str, Any]) -> None:
        """Keep ``value`` under ``key``; one the disk refuses (full, gone) is counted in
        ``unwritten`` and the search goes on: its outcome is in hand."""
        if self.folder is None:
            return
        text = json.dumps(value, sort_keys=True)
        try:
            write_atomically(self._path(key), lambda tmp: tmp.write_text(text, encoding="utf-8"))
        except OSError:
            self.unwritten += 1

    def run(
        self,
        kind: str,
        raw: dict[str, Any],
        base_dir: str,
        items: list[list[str]],
        compute: Callable[[list[list[str]]], list[dict[str, Any]]],
        advance: Callable[[int], None],
        forced: bool = False,
        store: Callable[[dict[str, Any]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """The outcomes of ``items`` (each a candidate's overrides), in order: those in
        the cache read from it (``advance`` told at once), the others from
        ``compute(missing)`` and then stored (``forced``: :meth:`key`), those ``store``
        accepts where it is given (an outcome that holds for one search only)."""
        if self.folder is None:
            return compute(items)
        base = json.dumps(raw, sort_keys=True, default=str)
        files: dict[tuple[str, ...], dict[str, list[str | None]]] = {}
        keys = [
            self.key(kind, raw, base_dir, overrides, base, files, forced) for overrides in items
        ]
        found = [self.get(key, kind) for key in keys]
        advance(sum(value is not None for value in found))
        missing = [i for i, value in enumerate(found) if value is None]
        computed = compute([items[i] for i in missing]) if missing else []
        for i, value in zip(missing, computed, strict=True):
            # JSON round trip: a fresh outcome reads exactly as a cached one would
            found[i] = json.loads(json.dumps(value, sort_keys=True))
            if store is None or store(value):
                self.put(keys[i], value)
        return cast("list[dict[str, Any]]", found)  # every missing one computed above
