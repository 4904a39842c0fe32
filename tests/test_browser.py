"""parasim's HTML reports opened in a real browser, and static images drawn by one.

Each report the commands write — ``parasim run`` (every ``*.html`` in its output
folder), ``sweep``, ``scale`` and ``compare`` — is opened in headless Chromium through
selenium from a ``file://`` URL, as a user would open it offline. Once plotly has drawn
every plot the test checks that the browser console holds no error, that the page has
plots and each plot has traces, that the timeline has exactly one lane per (rank,
stream) of the run's Trace, and that a screenshot of the page is not blank (the PNG is
decoded here with ``zlib`` and numpy). :func:`simulator.report.images.export_figure` is
checked against the same system browser.

Without Chromium, chromedriver, selenium or kaleido the browser tests are skipped on a
developer's machine, but fail when the ``CI`` environment variable is set: ``.ci/run``
installs them, so a missing browser there is a broken set-up, not a reason to skip.
One browser session is shared by the whole module.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import shutil
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import plotly.graph_objects as go
import pytest

from simulator.analysis.trace import Trace
from simulator.cli.main import main
from simulator.common.errors import ParasimError
from simulator.report.compare_report import load_run_dir
from simulator.report.images import ImageExportError, export_figure, export_figures, find_browser
from simulator.report.timeline import timeline_figure
from simulator.request.scenario import load_scenario
from simulator.run.simulate import make_trace, run_scenario, trace_ranks
from simulator.tools.compare import overlay_trace

from .conftest import SCENARIOS
from .helpers import write_traces

pytestmark = pytest.mark.browser  # and so slow: see tests/conftest.py

SMALL = SCENARIOS / "small.yaml"
# GPT-2 small on one DGX A100 node as tp 2 x pp 2 x dp 2: tensor, pipeline and data
# parallel lanes, ranks grouped in two pipeline stages; a run takes about a second
PIPELINE = ["parallel.pp=2", "parallel.dp=2"]

WINDOW = (1280, 900)
RENDER_TIMEOUT_S = 30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LANE = re.compile(r"r(\d+) (.+)")
CHROMEDRIVER_PATHS = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")

# True once every plot on the page has been laid out and drawn into its SVG
PLOTS_DRAWN = """
const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
return document.readyState === 'complete' && plots.length > 0 &&
    plots.every(gd => gd._fullLayout && gd._fullData && gd.querySelector('.main-svg'));
"""

# What each plot holds: its traces, its y-axis labels and the y ticks drawn
PLOT_FACTS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
    const y = (gd.layout && gd.layout.yaxis) || {};
    const full = (gd._fullLayout && gd._fullLayout.yaxis) || {};
    return {
        id: gd.id,
        traces: (gd.data || []).length,
        ticktext: y.ticktext ? Array.from(y.ticktext, String) : null,
        categories: full._categories ? Array.from(full._categories, String) : null,
        yticks_drawn: gd.querySelectorAll('.yaxislayer-above .ytick').length,
    };
});
"""


def _unavailable(reason: str) -> NoReturn:
    """Skip on a developer's machine; fail under CI, whose set-up installs the browser."""
    if os.environ.get("CI"):
        pytest.fail(
            f"{reason}; CI is set and .ci/run installs the browser, so it must be here",
            pytrace=False,
        )
    pytest.skip(reason)


def _system_browser(use: str) -> str:
    """The Chromium or Chrome that parasim's images use (``BROWSER_PATH``, else PATH)."""
    try:
        return find_browser()
    except ImageExportError as exc:
        reason = str(exc).replace("static images need a browser", f"{use} need a browser")
    _unavailable(reason)  # outside the except block: no chained traceback under CI


def _parasim(*argv: str | Path) -> None:
    """Run a parasim command in this process, its printed summary swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        status = main([str(arg) for arg in argv])
    assert status == 0, f"parasim {' '.join(map(str, argv))} exited with {status}"


def _run_trace() -> Trace:
    """The Trace that ``parasim run SMALL --set PIPELINE`` draws, simulated again here."""
    run = run_scenario(load_scenario(SMALL, PIPELINE))
    ranks, _ = trace_ranks(run)
    return make_trace(run, ranks)


def _set_options(overrides: list[str]) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


# -- PNG decoding (the screenshot check), with zlib and numpy only -----------------------


def decode_png(data: bytes) -> np.ndarray:
    """Pixels of an 8-bit, non-interlaced PNG as a (height, width, channels) array."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG file"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    assert header is not None, "PNG without IHDR"
    width, height, depth, colour, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
    assert depth == 8 and channels and not interlace, f"unsupported PNG: {header}"
    stride = width * channels
    rows = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, stride + 1)
    pixels = np.empty((height, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:]
        if kind == 0:
            pixels[y] = line
        elif kind == 1:  # Sub: a running sum along the row, per channel, modulo 256
            pixels[y] = np.cumsum(line.reshape(width, channels), axis=0, dtype=np.uint8).ravel()
        elif kind == 2:  # Up
            pixels[y] = line + prev
        else:  # Average and Paeth depend on the byte just decoded: byte by byte
            pixels[y] = np.frombuffer(
                _unfilter(kind, line.tobytes(), prev.tobytes(), channels), np.uint8
            )
        prev = pixels[y]
    return pixels.reshape(height, width, channels)


def _unfilter(kind: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    out = bytearray(len(line))
    for i, raw in enumerate(line):
        a = out[i - bpp] if i >= bpp else 0
        b = prev[i]
        if kind == 3:
            out[i] = (raw + ((a + b) >> 1)) & 255
            continue
        c = prev[i - bpp] if i >= bpp else 0
        pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
        out[i] = (raw + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return bytes(out)


def pixel_stats(png: bytes) -> dict[str, float]:
    """Distinct colours, and the share of pixels that are not near-white and that are
    coloured (not grey: text, axes and grid lines are grey, bars and lines are not)."""
    pixels = decode_png(png).astype(np.int32)
    if pixels.shape[2] < 3:  # grey, with or without alpha
        pixels = np.repeat(pixels[..., :1], 3, axis=2)
    flat = pixels[..., :3].reshape(-1, 3)
    spread = flat.max(axis=1) - flat.min(axis=1)
    packed = (flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]
    return {
        "colours": len(np.unique(packed)),
        "not_white": float((flat.min(axis=1) < 245).mean()),
        "coloured": float((spread > 60).mean()),
    }


def _encode_png(pixels: np.ndarray, filters: list[int]) -> bytes:
    """An RGB PNG of ``pixels`` with row ``y`` filtered by ``filters[y]``, written from
    the PNG specification's predictor formulas (independently of :func:`decode_png`)."""
    height, width, _ = pixels.shape
    raw, up = b"", np.zeros(width * 3, int)
    for y in range(height):
        cur = pixels[y].astype(int).ravel()
        left = np.concatenate([[0] * 3, cur[:-3]])
        upleft = np.concatenate([[0] * 3, up[:-3]])
        p = left + up - upleft
        pa, pb, pc = abs(p - left), abs(p - up), abs(p - upleft)
        paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, upleft))
        pred = [0 * cur, left, up, (left + up) // 2, paeth][filters[y]]
        raw += bytes([filters[y]]) + bytes(((cur - pred) % 256).astype(np.uint8))
        up = cur

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def test_the_png_decoder_reads_every_filter():
    pixels = np.random.default_rng(7).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    for first in range(5):  # each filter type after each other one
        filters = [(first + y) % 5 for y in range(5)]
        decoded = decode_png(_encode_png(pixels, filters))
        assert (decoded == pixels).all(), f"row filters {filters}"
    stats = pixel_stats(_encode_png(np.full((4, 4, 3), 255, np.uint8), [0, 1, 2, 4]))
    assert stats == {"colours": 1, "not_white": 0.0, "coloured": 0.0}


# -- the browser session and the reports -------------------------------------------------


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """One headless Chromium for the module, logging the browser console."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if webdriver is None:
        _unavailable("selenium is not installed (pip install '.[dev]')")
    browser = _system_browser("the HTML report checks")
    chromedriver = shutil.which("chromedriver") or next(
        (p for p in CHROMEDRIVER_PATHS if os.access(p, os.X_OK)), None
    )
    if chromedriver is None:
        _unavailable("chromedriver is not installed (apt install chromium-driver)")
    options = Options()
    options.binary_location = browser
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    session.set_page_load_timeout(RENDER_TIMEOUT_S)
    try:
        yield session
    finally:
        session.quit()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("browser")


@pytest.fixture(scope="module")
def run_dir(workdir: Path) -> Path:
    """The output folder of ``parasim run SMALL --set PIPELINE``."""
    folder = workdir / "run"
    _parasim("run", SMALL, *_set_options(PIPELINE), "--out", folder)
    return folder


def open_report(driver: Any, path: Path, screenshot: Path) -> dict[str, Any]:
    """Open ``path``, wait for plotly, and return the plots' facts and the screenshot's
    pixel statistics; fail on any console error."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(path.as_uri())
    try:
        WebDriverWait(driver, RENDER_TIMEOUT_S, poll_frequency=0.1).until(
            lambda d: d.execute_script(PLOTS_DRAWN)
        )
    except TimeoutException:
        logs = [entry["message"] for entry in driver.get_log("browser")]
        pytest.fail(f"{path.name}: plotly drew no plot in {RENDER_TIMEOUT_S} s; console: {logs}")
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, f"{path.name}: errors in the browser console: {errors}"
    plots = driver.execute_script(PLOT_FACTS)
    driver.execute_script(
        "document.querySelector('.js-plotly-plot').scrollIntoView({block: 'start'});"
    )
    assert driver.save_screenshot(str(screenshot)), f"{path.name}: no screenshot"
    return {"plots": plots, "pixels": pixel_stats(screenshot.read_bytes())}


def check_report(driver: Any, path: Path, workdir: Path) -> dict[str, Any]:
    """The checks every report passes: plots with traces, and a screenshot with content."""
    page = open_report(driver, path, workdir / f"{path.parent.name}-{path.stem}.png")
    plots, pixels = page["plots"], page["pixels"]
    assert len(plots) >= 1, f"{path.name}: no plot"
    for plot in plots:
        assert plot["traces"] > 0, f"{path.name}: plot {plot['id']!r} has no trace"
    # a blank or white page has one or two colours and no coloured pixel
    assert pixels["colours"] >= 16, f"{path.name}: screenshot looks blank: {pixels}"
    assert pixels["coloured"] >= 0.002, f"{path.name}: nothing coloured is drawn: {pixels}"
    return page


def check_lanes(page: dict[str, Any], trace: Trace, name: str) -> None:
    """The timeline's y axis has one lane per (rank, stream) of ``trace``."""
    expected = {(r.rank, r.stream) for r in trace.records}
    for plot in page["plots"]:
        labels = plot["ticktext"] or plot["categories"] or []
        lanes = [LANE.fullmatch(label) for label in labels]
        if labels and all(lanes):
            break
    else:
        pytest.fail(f"{name}: no plot has lanes labelled like 'r0 compute' on its y axis")
    drawn = [(int(m.group(1)), m.group(2)) for m in lanes if m]
    ranks = {rank for rank, _ in expected}
    assert len(drawn) == len(expected), (
        f"{name}: {len(drawn)} lanes, expected {len(expected)} for {len(ranks)} ranks"
    )
    assert set(drawn) == expected, f"{name}: lanes {sorted(set(drawn) ^ expected)} differ"
    assert plot["yticks_drawn"] == len(expected), f"{name}: {plot['yticks_drawn']} y ticks drawn"


# -- the reports -------------------------------------------------------------------------


def test_run_reports_render(driver, workdir, run_dir):
    pages = sorted(run_dir.glob("*.html"))  # and whatever else run writes
    assert {run_dir / "timeline.html", run_dir / "report.html"} <= set(pages)
    for path in pages:
        page = check_report(driver, path, workdir)
        if path.name == "timeline.html":
            check_lanes(page, _run_trace(), path.name)
        if path.name == "report.html":
            # a flow run: every chart, the timeline's lanes as in timeline.html
            ids = [plot["id"] for plot in page["plots"]]
            assert ids == ["breakdown", "exposed-comm", "memory", "links", "timeline"], ids
            timeline = [plot for plot in page["plots"] if plot["id"] == "timeline"]
            check_lanes({"plots": timeline}, _run_trace(), path.name)


def test_explain_report_renders(driver, workdir):
    out = workdir / "explain"
    teaching = SCENARIOS / "teaching" / "tp-across-nodes-mistake.yaml"
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(["explain", str(teaching), "--out", str(out)])
    assert status == 1  # the mistake is found
    page = check_report(driver, out / "explain.html", workdir)
    assert [plot["id"] for plot in page["plots"]][:1] == ["finding-1"]


def test_run_writes_static_images(image_browser, tmp_path):
    _parasim("run", SMALL, "--out", tmp_path, "--image", "svg")
    images = sorted(path.name for path in tmp_path.glob("*.svg"))
    assert images == ["breakdown.svg", "links.svg", "memory.svg", "timeline.svg"]
    for name in images:
        assert (tmp_path / name).read_text().lstrip().startswith("<svg")


def test_a_missing_browser_is_refused_before_simulating(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))
    assert main(["run", str(SMALL), "--out", str(tmp_path / "out"), "--image", "png"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "BROWSER_PATH" in err
    assert not (tmp_path / "out").exists()


def test_sweep_report_renders(driver, workdir):
    out = workdir / "sweep"
    _parasim(
        "sweep", SMALL, "--fix", "micro_batch=1", "--fix", "schedule=1f1b",
        "--fix", "recompute=none", "--fix", "placement=[tp,dp,pp]",
        "--workers", "1", "--out", out,
    )  # fmt: skip
    check_report(driver, out / "sweep.html", workdir)
    assert_on_screen(driver, "memory per GPU")


def assert_on_screen(driver: Any, header: str) -> None:
    """The table's ``header`` column ends within the window: no scrolling to read it."""
    right = driver.execute_script(
        "const th = Array.from(document.querySelectorAll('th'))"
        ".find(h => h.textContent === arguments[0]);"
        "return th ? th.getBoundingClientRect().right : null;",
        header,
    )
    assert right is not None and 0 < right <= WINDOW[0], f"{header!r} ends at {right} px"


def test_scale_report_renders(driver, workdir):
    out = workdir / "scale"
    _parasim("scale", SMALL, "--gpus", "8,16", "--workers", "1", "--out", out)
    check_report(driver, out / "scale.html", workdir)
    assert_on_screen(driver, "memory per GPU")
    # the GPU axis names the sizes run; the others are round numbers
    ticks = "return Array.from(document.querySelectorAll(arguments[0])).map(t => t.textContent);"
    assert driver.execute_script(ticks, ".xtick text") == ["8", "16"]
    labels = driver.execute_script(ticks, ".ytick text, .y2tick text")
    assert len(labels) >= 4
    for label in labels:
        number = float(label.replace(",", "").replace("k", "e3").replace("M", "e6"))
        if number:
            mantissa = number / 10 ** math.floor(math.log10(number))
            assert round(mantissa, 9) in (1, 1.5, 2, 2.5, 4, 5, 6, 8), f"tick {label!r}"


def test_compare_report_renders(driver, workdir, run_dir):
    # a second simulated run stands in for the measured one: the overlay is drawn alike
    measured = workdir / "run-pipeline-gpipe"
    overrides = [*PIPELINE, "parallel.schedule=gpipe"]
    _parasim("run", SMALL, *_set_options(overrides), "--out", measured)
    out = workdir / "compare"
    _parasim("compare", run_dir, measured, "--out", out)
    page = check_report(driver, out / "compare.html", workdir)
    overlay = overlay_trace(load_run_dir(run_dir)[1], load_run_dir(measured)[1], ("A", "B"))
    check_lanes(page, overlay, "compare.html")


def test_compare_against_profiler_traces_renders(driver, workdir):
    # a GPU run's traces of a step of SMALL (every rank drawn), one rank slower: the
    # page names it
    predicted = workdir / "run-small"
    _parasim("run", SMALL, "--outputs", "result,trace", "--out", predicted)
    traces = write_traces(predicted, workdir / "kineto", slow_rank=1, slower=1.5)
    out = workdir / "compare-traces"
    _parasim("compare", predicted, traces, "--out", out)
    check_report(driver, out / "compare.html", workdir)
    differences = driver.find_element("id", "parasim-differences")
    assert differences.is_displayed() and differences.text.startswith("rank 1:")


def test_plan_report_renders(driver, workdir):
    out = workdir / "plan"
    run = "run={tokens: 5e10, price_per_gpu_hour: 2, failures: {mtbf_node: '2 h'}}"
    _parasim("plan", SMALL, "--set", "cluster.preset=dgx-h100", "--set", run, "--out", out)
    check_report(driver, out / "plan.html", workdir)
    traces = "return document.querySelectorAll(arguments[0] + ' .scatterlayer .trace').length"
    assert driver.execute_script(traces, "body") >= 2, "progress and interruptions drawn"
    # the run's report shows the plan too, where the scenario has a run:
    ran = workdir / "run-with-plan"
    _parasim("run", SMALL, "--set", "cluster.preset=dgx-h100", "--set", run, "--out", ran)
    check_report(driver, ran / "report.html", workdir)
    assert driver.find_element("id", "plan").is_displayed()
    assert driver.execute_script(traces, "#plan") >= 2


def test_a_script_error_fails_the_console_check(driver, workdir):
    page = workdir / "broken.html"
    page.write_text(
        "<html><body><div class='js-plotly-plot'></div>"
        "<script>throw new Error('parasim-broken-page')</script></body></html>"
    )
    driver.get_log("browser")
    driver.get(page.as_uri())
    logs = driver.get_log("browser")
    assert any(e["level"] == "SEVERE" and "parasim-broken-page" in e["message"] for e in logs), (
        f"the console check would miss a script error: {logs}"
    )


# -- static images -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_browser() -> str:
    try:
        import kaleido
    except ImportError:
        kaleido = None
    if kaleido is None:
        _unavailable("kaleido is not installed (pip install '.[images]')")
    return _system_browser("static images")


def test_export_writes_png_and_svg(image_browser, tmp_path):
    figure, _ = timeline_figure(_run_trace(), "small: one training step")
    # one browser start for both images (export_figure is export_figures of one figure);
    # a figure's dict is drawn like the figure
    png, svg = export_figures(
        [(figure, tmp_path / "timeline.png"), (figure.to_dict(), tmp_path / "timeline.svg")],
        width=1000,
        height=700,
    )
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert struct.unpack(">II", data[16:24]) == (1000, 700)  # IHDR: width, height
    stats = pixel_stats(data)
    assert stats["colours"] >= 16 and stats["coloured"] >= 0.01, stats
    text = svg.read_text()
    assert text.lstrip().startswith("<svg") and "r0 compute" in text
    assert not list(tmp_path.glob(".*")), "temporary files left behind"


def test_export_errors_say_what_to_install(tmp_path, monkeypatch):
    figure = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    target = tmp_path / "figure.png"

    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))
    with pytest.raises(ImageExportError) as missing:
        export_figure(figure, target)
    message = str(missing.value)
    assert isinstance(missing.value, ParasimError) and "\n" not in message
    assert "BROWSER_PATH" in message and "no-such-chromium" in message

    monkeypatch.delenv("BROWSER_PATH")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ImageExportError, match="apt install chromium"):
        export_figure(figure, target)

    monkeypatch.setenv("BROWSER_PATH", sys.executable)  # an executable, so kaleido is next
    monkeypatch.setitem(sys.modules, "kaleido", None)
    with pytest.raises(ImageExportError, match="pip install kaleido"):
        export_figure(figure, target)

    with pytest.raises(ImageExportError, match=r"\.png, \.svg"):
        export_figure(figure, tmp_path / "figure.gif")
    with pytest.raises(ImageExportError, match="format 'gif'"):
        export_figure(figure, target, format="gif")
    assert not target.exists() and not list(tmp_path.glob(".*"))


# what the timeline's zoom shows: the view ('merged' or 'ops'), the bars drawn in each
# trace, and whether a time axis is drawn at the bottom as well as at the top
TIMELINE_VIEW = """
const gd = document.getElementById('parasim-timeline');
return {
    view: gd.dataset.view || null,
    bars: gd.data.filter(t => t.type === 'bar').map(t => (t.x || []).length),
    opacity: gd.data.filter(t => t.type === 'bar').map(t => t.marker.opacity),
    axes: gd.querySelectorAll('.xtick').length > 0 &&
        gd.querySelectorAll('.x2tick').length > 0,
};
"""


def test_zooming_in_draws_merged_ops_one_by_one(driver, tmp_path):
    """A timeline whose ops were merged to fit draws them one by one once a zoom leaves
    few enough in view, so no lane is drawn busy where it was idle, and merges them again
    when zoomed out; the time axis is at the top and the bottom."""
    from selenium.webdriver.support.ui import WebDriverWait

    from simulator.report.timeline import write_timeline_html

    from .test_reports import big_trace

    trace = big_trace(ranks=2, ops=2000)  # 0.9 ms ops 0.1 ms apart: merged to fit
    path = tmp_path / "timeline.html"
    info = write_timeline_html(trace, path, title="zoom", max_bars=500)
    assert info["zoom_detail"] and info["bars"] <= 500
    page = open_report(driver, path, tmp_path / "before.png")
    assert page["plots"][0]["traces"] > 0
    before = driver.execute_script(TIMELINE_VIEW)
    assert before["view"] == "merged" and before["axes"], before
    assert sum(before["bars"]) == info["bars"]

    def zoom(lo: float, hi: float, view: str) -> dict[str, Any]:
        driver.execute_script(
            "Plotly.relayout('parasim-timeline', {'xaxis.range': arguments[0]});", [lo, hi]
        )
        WebDriverWait(driver, RENDER_TIMEOUT_S, poll_frequency=0.1).until(
            lambda d: d.execute_script(TIMELINE_VIEW)["view"] == view
        )
        return driver.execute_script(TIMELINE_VIEW)

    # 100 ms hold 100 ops per rank: 2 x 101 overlapping the window, each drawn alone
    lo, hi = 500.0, 600.0
    inside = [r for r in trace.records if r.start * 1e3 <= hi and r.end * 1e3 >= lo]
    zoomed = zoom(lo, hi, "ops")
    assert sum(zoomed["bars"]) == len(inside)
    # each op alone, fully opaque: nothing between them drawn as busy
    assert all(o == 1 for trace_opacity in zoomed["opacity"] for o in trace_opacity)
    # back out: the merged bars again
    out = zoom(0.0, 2000.0, "merged")
    assert out["bars"] == before["bars"]
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_a_zoom_redraws_the_merged_categories_and_keeps_the_others(driver, tmp_path):
    """Only the forward train was merged: zoomed in, its ops are drawn one by one and
    the five TP all-reduces, drawn op by op from the start, stay as they were."""
    from selenium.webdriver.support.ui import WebDriverWait

    from simulator.report.timeline import write_timeline_html

    from .test_reports import thin_train_and_wide_ops

    trace = thin_train_and_wide_ops()
    path = tmp_path / "timeline.html"
    info = write_timeline_html(trace, path, title="zoom", max_bars=50)
    assert info["zoom_detail"]
    open_report(driver, path, tmp_path / "before.png")
    before = driver.execute_script(TIMELINE_VIEW)
    driver.execute_script(
        "Plotly.relayout('parasim-timeline', {'xaxis.range': arguments[0]});", [0.0, 0.004]
    )
    WebDriverWait(driver, RENDER_TIMEOUT_S, poll_frequency=0.1).until(
        lambda d: d.execute_script(TIMELINE_VIEW)["view"] == "ops"
    )
    zoomed = driver.execute_script(TIMELINE_VIEW)
    inside = [r for r in trace.records if r.op == "compute" and r.start * 1e3 <= 0.004]
    assert zoomed["bars"][0] == len(inside) > before["bars"][0]  # forward, op by op
    assert zoomed["bars"][1] == before["bars"][1] == 5  # comm:tp, as drawn
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
