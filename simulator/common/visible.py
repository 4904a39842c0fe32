"""Text from outside parasim (a message naming a user's value, a kernel's name from
someone's trace) made safe to show on a terminal.

Every character beyond printable ASCII is looked at, and those a terminal would act on
or hide are quoted as Python escapes them: C0 controls and DEL, C1 controls (``\\x9b``
is a one-byte CSI on some terminals), and every other non-printable one (bidirectional
overrides such as U+202E, zero-width and line-separator characters). Printable text
beyond ASCII (a name in another script) stays as it is."""

from __future__ import annotations

import re

__all__ = ["visible"]

_UNSAFE = re.compile(r"[^\x20-\x7e]")


def _quoted(char: str) -> str:
    r"""A character as Python escapes it: ``\x1b``, ``\u202e``."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    return char if char.isprintable() else _quoted(char)


def visible(text: str) -> str:
    r"""``text`` with every control or invisible character quoted (``\x1b``, ``\u202e``)."""
    return _UNSAFE.sub(_shown, text)
