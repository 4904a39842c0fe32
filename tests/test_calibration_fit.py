"""The calibration's line fit (the ring model's ``t = a + b·S`` from a measured sweep),
and what the calibration does when a busy machine gives a sweep whose times do not grow
with size."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hardware.calibrate import SWEEP_ATTEMPTS, _until_it_fits, fit_line  # noqa: E402
from hardware.runtime import HardwareError  # noqa: E402

SIZES = [4096.0, 65536.0, 1048576.0, 4194304.0]
CLEAN = [50e-6 + 1e-9 * s for s in SIZES]
# the small sizes' means each caught a descheduled process: slower than the largest
DISTURBED = [9e-3, 8e-3, 6e-3, 4.3e-3]


def _rows(times: list[float]) -> list[dict]:
    return [{"bytes": s, "seconds": t} for s, t in zip(SIZES, times, strict=True)]


def test_a_clean_sweep_gives_back_its_fixed_cost_and_rate():
    a, b, rms = fit_line(SIZES, CLEAN)
    assert a == pytest.approx(50e-6, rel=1e-9)
    assert b == pytest.approx(1e-9, rel=1e-9)
    assert rms == pytest.approx(0.0, abs=1e-15)


def test_a_negative_fixed_cost_is_fitted_through_the_origin():
    a, b, _ = fit_line([1e6, 2e6, 4e6], [0.9e-3, 2.0e-3, 4.1e-3])
    assert a == 0.0 and b > 0


def test_a_sweep_that_does_not_grow_is_refused_with_its_numbers():
    with pytest.raises(HardwareError, match=r"positive slope to 4 points .*0\.009 s"):
        fit_line(SIZES, DISTURBED)


def test_a_disturbed_sweep_is_measured_again(capsys):
    measured = iter([_rows(DISTURBED), _rows(CLEAN)])
    rows = _until_it_fits(lambda: next(measured), "all_reduce on 2 ranks")
    assert [r["seconds"] for r in rows] == CLEAN
    err = capsys.readouterr().err
    assert "all_reduce on 2 ranks" in err and "measuring again" in err


def test_a_gemm_sweep_is_fitted_against_its_flops(capsys):
    flops = [{"flops": s, "bytes": 1.0, "seconds": t} for s, t in zip(SIZES, CLEAN, strict=True)]
    measured = iter([[{**r, "seconds": t} for r, t in zip(flops, DISTURBED, strict=True)], flops])
    assert _until_it_fits(lambda: next(measured), "matmul", size="flops") == flops
    assert "matmul" in capsys.readouterr().err


def test_a_sweep_that_never_fits_is_an_error_naming_the_collective():
    calls = []

    def measure() -> list[dict]:
        calls.append(1)
        return _rows(DISTURBED)

    with pytest.raises(HardwareError, match=r"^all_to_all on 4 ranks: cannot fit"):
        _until_it_fits(measure, "all_to_all on 4 ranks")
    assert len(calls) == SWEEP_ATTEMPTS


def test_a_ping_pong_s_two_ranks_take_the_initiator_s_decision(capsys):
    """The rank whose own rows fit measures again when the initiator's did not, and the
    rank whose own rows do not fit keeps them when the initiator's did."""
    initiator_fits = iter([False, True])
    measured = iter([_rows(CLEAN), _rows(CLEAN)])
    rows = _until_it_fits(lambda: next(measured), "send/recv", lambda _: next(initiator_fits))
    assert next(measured, None) is None and rows == _rows(CLEAN)
    assert "measuring again" not in capsys.readouterr().err
    kept = _until_it_fits(lambda: _rows(DISTURBED), "send/recv", lambda _: True)
    assert kept == _rows(DISTURBED)
