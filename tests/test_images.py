"""Static image export's own logic, with a stand-in for kaleido (no browser needed)."""

from __future__ import annotations

import sys
import types

import plotly.graph_objects as go
import pytest

from simulator.report.images import ImageExportError, export_figure


def _fake_kaleido(failures: list[str]) -> types.ModuleType:
    """A kaleido whose sessions fail with the queued messages, then draw."""

    class Kaleido:
        def __init__(self, **_options):
            pass

        async def __aenter__(self):
            return self

        async def __aexit__(self, *_exc):
            return False

        async def calc_fig(self, _figure, opts=None):
            if failures:
                raise RuntimeError(failures.pop(0))
            return b"<svg/>"

    module = types.ModuleType("kaleido")
    module.Kaleido = Kaleido  # type: ignore[attr-defined]
    return module


def test_a_page_not_ready_is_drawn_again_once(monkeypatch, tmp_path):
    """On a busy machine kaleido may ask its page to draw before the page has loaded:
    one fresh session draws it; a second failure, or any other, is one line."""
    monkeypatch.setenv("BROWSER_PATH", sys.executable)
    figure, target = go.Figure(), tmp_path / "figure.svg"
    not_ready = "ReferenceError: kaleido_scopes is not defined"
    monkeypatch.setitem(sys.modules, "kaleido", _fake_kaleido([not_ready]))
    export_figure(figure, target)
    assert target.read_bytes() == b"<svg/>"

    monkeypatch.setitem(sys.modules, "kaleido", _fake_kaleido([not_ready, not_ready]))
    with pytest.raises(ImageExportError, match="kaleido_scopes is not defined"):
        export_figure(figure, tmp_path / "again.svg")
    monkeypatch.setitem(sys.modules, "kaleido", _fake_kaleido(["the browser crashed", ""]))
    with pytest.raises(ImageExportError, match="the browser crashed"):
        export_figure(figure, tmp_path / "crash.svg")
