"""Static images of parasim's charts: PNG and SVG files drawn by a headless browser.

:func:`export_figure` writes a plotly figure — the timeline, a sweep or scaling chart —
as a PNG or SVG file, for slides, papers and pull requests where an interactive HTML
report does not fit. The drawing is done by `kaleido <https://pypi.org/project/kaleido/>`_
(``pip install 'parasim[images]'``), which renders the figure with plotly.js in a
headless Chromium or Chrome. Starting the browser and loading plotly.js takes a few
seconds, so :func:`export_figures` draws several figures with one start.

parasim uses the browser already installed on the machine and never downloads one:

* ``BROWSER_PATH``, when set, names the browser's executable;
* otherwise the first of ``chromium``, ``chromium-browser``, ``google-chrome`` and
  ``google-chrome-stable`` found on ``PATH`` is used (on Debian:
  ``apt install chromium``).

The browser loads plotly.js from the installed plotly package and no MathJax, so an
export needs no network. Without kaleido or without a browser, :class:`ImageExportError`
(a :class:`~simulator.common.errors.ParasimError`, so the command line prints it as one line and
exits with status 2) says what to install. Files are written atomically: a failed
export leaves any previous file in place.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from simulator.common.errors import ParasimError
from simulator.common.files import write_atomically

__all__ = [
    "check_requirements",
    "BROWSER_NAMES",
    "DEFAULT_HEIGHT",
    "DEFAULT_WIDTH",
    "FORMATS",
    "ImageExportError",
    "export_figure",
    "export_figures",
    "find_browser",
]

#: The image formats :func:`export_figure` writes, by file suffix.
FORMATS: tuple[str, ...] = ("png", "svg")

#: Executables looked for on ``PATH`` when ``BROWSER_PATH`` is not set, in this order.
BROWSER_NAMES: tuple[str, ...] = (
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)

#: Size in CSS pixels of an image whose figure sets no width or height of its own.
DEFAULT_WIDTH = 1200
DEFAULT_HEIGHT = 700

#: Seconds the browser may take to draw one figure before the export fails.
_TIMEOUT_S = 90

#: Characters of a kaleido or browser failure kept in the one-line error.
_DETAIL_CHARS = 400

_INSTALL_BROWSER = "apt install chromium, or set BROWSER_PATH to a Chromium or Chrome executable"


class ImageExportError(ParasimError):
    """A figure could not be drawn as an image: no kaleido, no browser, or a bad request."""


def _browser_problem() -> tuple[str | None, str | None]:
    """(the browser's path, None), or (None, what is wrong and what to install)."""
    configured = os.environ.get("BROWSER_PATH")
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            return None, (
                f"BROWSER_PATH={configured} is not an executable file; point it at "
                "Chromium or Chrome, or unset it to use chromium from PATH"
            )
        return str(path), None
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found, None
    return None, f"none of {', '.join(BROWSER_NAMES)} is on PATH: {_INSTALL_BROWSER}"


def find_browser() -> str:
    """The path of the Chromium or Chrome executable that draws images.

    ``BROWSER_PATH`` wins when set (it must name an executable file); otherwise the
    first of :data:`BROWSER_NAMES` on ``PATH``. Raises :class:`ImageExportError` saying
    what to install when there is none.
    """
    browser, problem = _browser_problem()
    if browser is None:
        raise ImageExportError(f"static images need a browser: {problem}")
    return browser


def check_requirements() -> None:
    """Raise :class:`ImageExportError` now if kaleido or a browser is missing, so a
    command can refuse before it spends minutes simulating."""
    _requirements()


def _requirements() -> tuple[Any, str]:
    """The kaleido module and the browser's path; one error naming all that is missing."""
    try:
        import kaleido
    except ImportError:
        kaleido = None
    browser, problem = _browser_problem()
    missing = [] if kaleido else ["kaleido (pip install kaleido, or parasim[images])"]
    if problem:
        missing.append(f"a browser: {problem}")
    if missing:
        raise ImageExportError(f"static images need {'; and '.join(missing)}")
    assert browser is not None
    return kaleido, browser


def _image_format(path: Path, format: str | None) -> str:
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        given = f"format {format!r}" if format else f"suffix {path.suffix or '(none)'!r}"
        raise ImageExportError(
            f"{path}: cannot write an image with {given}; use one of "
            f"{', '.join('.' + f for f in FORMATS)}"
        )
    return fmt


def _layout_size(figure: Any, key: str) -> float | None:
    layout = figure.get("layout", {}) if isinstance(figure, dict) else figure.layout
    value = layout.get(key) if isinstance(layout, dict) else getattr(layout, key, None)
    return value or None


# what kaleido's page says when it is asked to draw before its script has loaded
_PAGE_NOT_READY = "kaleido_scopes is not defined"


def _render(jobs: list[tuple[Any, dict[str, Any]]]) -> list[bytes]:
    """Draw each (figure, kaleido options) in one browser session; the images' bytes."""
    kaleido, browser = _requirements()

    async def draw() -> list[bytes]:
        # plotly.js comes from the plotly package; without MathJax nothing is fetched
        async with kaleido.Kaleido(path=browser, mathjax=False, timeout=_TIMEOUT_S) as k:
            return [await k.calc_fig(figure, opts=opts) for figure, opts in jobs]

    def run_draw() -> list[bytes]:
        import asyncio  # only to draw: a run that draws nothing does not load it

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(draw())
        # called from a running event loop (a notebook): draw in a thread of its own
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, draw()).result()

    try:
        try:
            images = run_draw()
        except Exception as exc:
            # on a busy machine kaleido may ask its page to draw before the page's own
            # script has defined its functions: a fresh session once more
            if _PAGE_NOT_READY not in str(exc):
                raise
            images = run_draw()
    except Exception as exc:  # kaleido's and the browser's failures, in one line
        words = " ".join(str(arg) for arg in exc.args).split()
        detail = " ".join(words)[:_DETAIL_CHARS] or type(exc).__name__
        raise ImageExportError(f"could not draw an image with {browser}: {detail}") from exc
    return [data.encode() if isinstance(data, str) else bytes(data) for data in images]


def export_figures(
    jobs: Iterable[tuple[Any, str | Path]],
    format: str | None = None,
    width: int | None = None,
    height: int | None = None,
    scale: float = 1.0,
) -> list[Path]:
    """Write each ``(figure, path)`` of ``jobs`` as :func:`export_figure` does, starting
    the browser once for all of them (each start costs seconds). Every path is checked
    before anything is drawn, and nothing is written unless every figure was drawn."""
    if scale <= 0:
        raise ImageExportError(f"scale must be positive, got {scale}")
    planned: list[tuple[Any, dict[str, Any]]] = []
    paths: list[Path] = []
    for figure, target in jobs:
        path = Path(target)
        opts = {
            "format": _image_format(path, format),
            "width": width or _layout_size(figure, "width") or DEFAULT_WIDTH,
            "height": height or _layout_size(figure, "height") or DEFAULT_HEIGHT,
            "scale": scale,
        }
        planned.append((figure, opts))
        paths.append(path)
    if not planned:
        return []
    images = _render(planned)
    for path, data in zip(paths, images, strict=True):
        write_atomically(path, functools.partial(Path.write_bytes, data=data))
    return paths


def export_figure(
    figure: Any,
    path: str | Path,
    format: str | None = None,
    width: int | None = None,
    height: int | None = None,
    scale: float = 1.0,
) -> Path:
    """Write ``figure`` (a ``plotly.graph_objects.Figure`` or its dict) to ``path``.

    ``format`` is ``"png"`` or ``"svg"``; by default it is read from the suffix of
    ``path``. ``width`` and ``height`` are in CSS pixels and default to the figure's
    own layout size, else :data:`DEFAULT_WIDTH` × :data:`DEFAULT_HEIGHT`; ``scale``
    multiplies the pixels of a PNG (2 for a sharp image on a high-density screen).
    Returns ``path``. Raises :class:`ImageExportError` when kaleido or a browser is
    missing (naming what to install), for an unknown format, or when drawing fails;
    the file is then left as it was. Each call starts the browser anew (a few
    seconds); :func:`export_figures` draws several figures with one start.
    """
    return export_figures([(figure, path)], format, width, height, scale)[0]
