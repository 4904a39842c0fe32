"""Results of a search's candidates kept on disk, so that a rerun simulates only what is
new.

A sweep checks and simulates each candidate layout from the scenario's raw dict and
the candidate's ``--set`` overrides. :class:`ResultCache` keys each outcome by a hash
of everything it depends on:

* what was computed (``check`` or ``simulate``);
* the candidate's whole scenario (the raw dict with its overrides applied);
* the contents of the files that scenario names (a calibration profile, a custom
  topology, a schedule file), so editing one invalidates what it fed;
* parasim's version and a fingerprint of its own code and presets (a hash of every
  source file of ``simulator`` and ``topologies``), so a changed model never serves an
  old number.

Each outcome is one small JSON file, ``<folder>/<key[:2]>/<key>.json``, written
atomically: concurrent sweeps sharing a folder never read half a file. Nothing is
ever evicted; delete the folder to start afresh. ``parasim sweep --cache DIR`` names
the folder, ``--no-cache`` turns it off; by default it is ``.parasim-cache`` beside
the output folder (the output folder itself is replaced whole on every run).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator.common.files import write_atomically
from simulator.common.version import __version__
from simulator.request.scenario import apply_overrides

__all__ = ["ResultCache", "code_fingerprint", "DEFAULT_CACHE_NAME"]

#: The default cache folder's name, beside the output folder.
DEFAULT_CACHE_NAME = ".parasim-cache"

# scenario fields that name a file whose content decides the outcome
_FILE_FIELDS = (("cluster", "profile"), ("cluster", "topology"), ("parallel", "schedule_file"))
_FILE_KEYS = tuple(f"{section}.{name}" for section, name in _FILE_FIELDS)


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


def _file_digest(value: Any, base_dir: str) -> str | None:
    if not isinstance(value, str):
        return None
    path = Path(value) if Path(value).is_absolute() else Path(base_dir) / value
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # the check itself will say the file is missing


class ResultCache:
    """Outcomes of candidates on disk (``folder`` None: no cache, every lookup misses)."""

    def __init__(self, folder: str | Path | None):
        self.folder = Path(folder) if folder is not None else None
        self.hits = 0

    def key(
        self,
        kind: str,
        raw: dict[str, Any],
        base_dir: str,
        overrides: list[str],
        base: str | None = None,
    ) -> str:
        """The key of ``kind`` (``check``, ``simulate``) of one candidate: the base
        scenario (``base``: its canonical JSON, when already made) and the overrides as
        given (parsing thousands of overrides would cost more than the lookups save),
        and the files the candidate's scenario names."""
        named = (
            apply_overrides(raw, overrides)
            if any(o.split("=", 1)[0].endswith(_FILE_KEYS) for o in overrides)
            else raw
        )
        files = {
            ".".join(field): _file_digest((named.get(field[0]) or {}).get(field[1]), base_dir)
            for field in _FILE_FIELDS
            if isinstance(named.get(field[0]), dict)
        }
        payload = json.dumps(
            {
                "kind": kind,
                "scenario": base or json.dumps(raw, sort_keys=True, default=str),
                "overrides": overrides,
                "files": files,
                "code": code_fingerprint(),
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if self.folder is None:
            return None
        try:
            value = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        self.hits += 1
        return value

    def put(self, key: str, value: dict[str, Any]) -> None:
        if self.folder is None:
            return
        text = json.dumps(value, sort_keys=True)
        write_atomically(self._path(key), lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def run(
        self,
        kind: str,
        raw: dict[str, Any],
        base_dir: str,
        items: list[list[str]],
        compute: Callable[[list[list[str]]], list[dict[str, Any]]],
        advance: Callable[[int], None],
    ) -> list[dict[str, Any]]:
        """The outcomes of ``items`` (each a candidate's overrides), in order: those in
        the cache read from it (``advance`` told at once), the others from
        ``compute(missing)`` and then stored."""
        if self.folder is None:
            return compute(items)
        base = json.dumps(raw, sort_keys=True, default=str)
        keys = [self.key(kind, raw, base_dir, overrides, base) for overrides in items]
        found = [self.get(key) for key in keys]
        advance(sum(value is not None for value in found))
        missing = [i for i, value in enumerate(found) if value is None]
        computed = compute([items[i] for i in missing]) if missing else []
        for i, value in zip(missing, computed, strict=True):
            # JSON round trip: a fresh outcome reads exactly as a cached one would
            found[i] = json.loads(json.dumps(value, sort_keys=True))
            self.put(keys[i], value)
        return found  # type: ignore[return-value]
