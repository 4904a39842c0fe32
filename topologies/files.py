"""Reading the small text files a configuration names: scenarios, custom topologies,
calibration profiles, custom pipeline orders.

:func:`read_config_text` reads one only when it is a regular file of at most
:data:`LARGEST_CONFIG` bytes (a scenario :data:`LARGEST_SCENARIO`, a custom topology
:data:`LARGEST_TOPOLOGY`) in UTF-8, so a path that names a device (``/dev/zero``), a
folder or a huge file is refused at once instead of hanging or filling memory. Its
one-line :class:`ConfigFileError` names the path and what is wrong, never the file's
content; each caller prefixes the field that named the file. What the text may hold is
bounded next, by :mod:`topologies.config_text`.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ConfigFileError",
    "LARGEST_CONFIG",
    "LARGEST_SCENARIO",
    "LARGEST_TOPOLOGY",
    "read_config_text",
]

#: The largest configuration file read: far above any topology, profile or order file
#: (a 1,024-rank custom order is about 1 MB).
LARGEST_CONFIG = 16 * 2**20
#: The largest scenario file read: a scenario is a few KB, and one holding a custom
#: topology inline, a graph of 1,024 GPUs, about 500 KB.
LARGEST_SCENARIO = 2**20
#: The largest custom topology file read: a graph of 1,024 GPUs (four NVSwitches a node,
#: a NIC a GPU, 8 rails, 16 spines) is about 500 KB written a device or link a line.
LARGEST_TOPOLOGY = 4 * 2**20


class ConfigFileError(ValueError):
    """A configuration file that cannot be read: ``path: reason``, in one line."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def read_config_text(path: str | Path, largest: int = LARGEST_CONFIG) -> str:
    """The text of ``path``, a regular UTF-8 file of at most ``largest`` bytes."""
    path = Path(path)
    try:
        if not path.exists():
            raise ConfigFileError(path, "no such file")
        if path.is_dir():
            raise ConfigFileError(path, "a folder, not a file")
        if not path.is_file():
            raise ConfigFileError(path, "not a regular file (a device, a pipe or a socket)")
        size = path.stat().st_size
        if size > largest:
            raise ConfigFileError(
                path,
                f"{size} bytes, more than any configuration file of its kind ({largest} at most)",
            )
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(path, "not UTF-8 text") from None
    except OSError as exc:
        raise ConfigFileError(path, str(exc.strerror)) from None
