"""One copy of plotly.js per output folder, beside the pages that draw with it.

Every HTML page parasim writes (``report.html``, ``timeline.html``, ``sweep.html``,
``scale.html``, ``explain.html``, ``compare.html``) loads plotly.js from
``plotly.min.js`` in its own folder, by a relative path: the folder opens offline, from
``file://`` or any static server, and holds the 4.8 MB bundle once however many pages
it has. :func:`write_plotly_js` puts the bundle (the one the installed plotly ships)
there, atomically, unless an identical copy already is.
"""

from __future__ import annotations

import functools
from pathlib import Path

from simulator.common.files import write_atomically

__all__ = ["PLOTLY_JS", "SCRIPT_TAG", "write_plotly_js"]

#: The bundle's file name beside the pages.
PLOTLY_JS = "plotly.min.js"
#: How a page loads it.
SCRIPT_TAG = f'<script src="{PLOTLY_JS}" charset="utf-8"></script>'


@functools.cache
def _bundle() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode("utf-8")


def write_plotly_js(folder: str | Path) -> Path:
    """Write the bundle as ``plotly.min.js`` in ``folder`` unless it is there already."""
    path = Path(folder) / PLOTLY_JS
    data = _bundle()
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return path
    write_atomically(path, lambda tmp: tmp.write_bytes(data))
    return path
