"""Writing result files safely: all-or-nothing, never a half-written file.

Each file is written to a temporary name in its destination folder and moved into
place with ``os.replace``, which is atomic, so an interrupted run leaves the previous
file intact.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["write_atomically", "write_json", "write_csv", "dumps_result"]


def write_atomically(
    path: Path, write: Callable[[Path], Any], final: Callable[[Any], Path] | None = None
) -> Any:
    """Call ``write(tmp_path)``, then move the temporary file to ``path`` (or, with
    ``final``, to ``final(outcome)``, the path the write's outcome chooses)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    tmp = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file normal permissions
    try:
        outcome = write(tmp)
        os.replace(tmp, path if final is None else final(outcome))
        return outcome
    finally:
        if tmp.exists():
            tmp.unlink()


def dumps_result(result: dict[str, Any]) -> str:
    """Canonical JSON text of a result: sorted keys, so equal results are equal bytes."""
    return json.dumps(result, sort_keys=True, indent=2) + "\n"


def write_csv(
    path: Path,
    fields: tuple[str, ...],
    rows: list[dict[str, Any]],
    value: Callable[[dict[str, Any], str], Any],
) -> None:
    """Write ``rows`` as CSV with a header of ``fields``, each cell ``value(row, field)``."""

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(fields)
            for row in rows:
                writer.writerow([value(row, key) for key in fields])

    write_atomically(path, write)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(dumps_result(payload)))
