"""The one units parser of parasim: human quantities in, SI floats out.

Scenario and preset files speak in human units (``80 GiB``, ``450 GB/s``,
``200 Gb/s``, ``1.5 us``, ``312 TFLOP/s``); everything inside parasim works in SI
base units — bytes, bytes per second, seconds and FLOP per second — as plain
floats. The functions here are the only place where one turns into the other.

Rules, the same for every quantity:

- A bare number (``int``, ``float`` or a string such as ``"1e9"``) is already in the
  base unit and passes through. In a scenario or preset field (the pydantic types
  below) it must also be plausible in that unit: a size under 1 MB, a bandwidth under
  1 MB/s, a FLOP rate under 1 GFLOP/s or a time of one second or more is refused with a
  request for a unit (``--set cluster.nic.bandwidth=450`` would otherwise be 450
  bytes/s and a 46-hour step). Zero passes.
- In those fields every value, bare or with a unit, must also lie in the range a real
  device has (:data:`PLAUSIBLE`): ``1e-300 TFLOP/s`` would give steps of 1e300 s and
  ``1e30 s`` of latency as many, so both are refused naming the value. Zero passes.
- Decimal prefixes ``k M G T P E`` are powers of 1000; binary prefixes
  ``Ki Mi Gi Ti Pi Ei`` are powers of 1024.
- In a bandwidth an upper-case ``B`` is a byte and a lower-case ``b`` is a bit:
  ``"200 Gb/s"`` and ``"200 Gbps"`` are 25e9 bytes/s, ``"450 GB/s"`` is 450e9.
- Negative, infinite and NaN values are errors; zero is accepted here (models that
  need a positive value say so themselves).

Each parser raises :class:`UnitError` (a ``ValueError``) with one line that quotes
the text and shows the expected form. ``Bytes``, ``Bandwidth``, ``Seconds`` and
``FlopRate`` are pydantic field types that run these parsers before validation.
The ``format_*`` helpers go the other way, for summaries and reports. A GPU's power
(``"700 W"``) and clock (``"1830 MHz"``) read the same way, in watts and hertz.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator

from .validation import shown

__all__ = [
    "UnitError",
    "parse_bytes",
    "parse_bandwidth",
    "parse_time",
    "parse_duration",
    "parse_flops",
    "parse_power",
    "parse_frequency",
    "Bytes",
    "Bandwidth",
    "Seconds",
    "Duration",
    "FlopRate",
    "Watts",
    "Hertz",
    "format_bytes",
    "format_bandwidth",
    "format_time",
    "format_flops",
    "PLAUSIBLE",
]


class UnitError(ValueError):
    """A quantity could not be read in the unit its field expects."""


_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {
    "Ki": 2.0**10,
    "ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
#: The longest text a quantity is written in (``"989.4 TFLOP/s"``, with room to spare);
#: a longer one is not read, so the pattern below never scans a megabyte.
_LONGEST_QUANTITY = 64
_QUANTITY = re.compile(rf"^\s*(?P<number>{_NUMBER})\s*(?P<unit>[^\s\d.+-].*?)?\s*$")


def _prefixed(suffix_factors: dict[str, float]) -> dict[str, float]:
    """Every ``<prefix><suffix>`` spelling of a unit, mapped to its factor."""
    table: dict[str, float] = {}
    for suffix, factor in suffix_factors.items():
        for prefix, scale in (_DECIMAL | _BINARY).items():
            table[f"{prefix}{suffix}"] = scale * factor
    return table


_BYTE_UNITS = {"": 1.0, "byte": 1.0, "bytes": 1.0} | _prefixed({"B": 1.0})
_BANDWIDTH_UNITS = {"": 1.0} | _prefixed(
    {"B/s": 1.0, "Bps": 1.0, "b/s": 1 / 8, "bps": 1 / 8, "bit/s": 1 / 8}
)
_TIME_UNITS = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # MICRO SIGN
    "\u03bcs": 1e-6,  # GREEK SMALL LETTER MU
    "ns": 1e-9,
}
# a whole run's durations: a checkpoint's interval, a restart, a time between failures
_DURATION_UNITS = {
    **_TIME_UNITS,
    "min": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
# FLOP units are matched case-insensitively: "TFLOPS", "TFLOP/s" and "tflops" agree.
_FLOP_UNITS = {
    f"{prefix.lower()}{suffix}": scale
    for prefix, scale in _DECIMAL.items()
    for suffix in ("flop/s", "flops", "flops/s")
}
_POWER_UNITS = {"": 1.0, "W": 1.0, "kW": 1e3}
_FREQUENCY_UNITS = {"": 1.0, "Hz": 1.0, "kHz": 1e3, "MHz": 1e6, "GHz": 1e9}


def _parse(
    value: Any,
    units: dict[str, float],
    what: str,
    example: str,
    fold_case: bool = False,
) -> float:
    """Read ``value`` as a non-negative quantity using the ``units`` table."""
    if isinstance(value, bool):
        raise UnitError(f"cannot read {value!r} as {what} (expected e.g. {example})")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond a float's range
            number = math.inf
    elif isinstance(value, str):
        match = _QUANTITY.match(value) if len(value) <= _LONGEST_QUANTITY else None
        unit = (match.group("unit") or "") if match else None
        if unit is not None and fold_case:
            unit = unit.lower()
        if match is None or unit not in units:
            raise UnitError(f"cannot read {shown(value)} as {what} (expected e.g. {example})")
        number = float(match.group("number")) * units[unit]
    else:
        raise UnitError(
            f"cannot read {shown(value)} ({type(value).__name__}) as {what} "
            f"(expected e.g. {example})"
        )
    if not math.isfinite(number):
        raise UnitError(f"{shown(value)} is not a finite {what.removeprefix('a ')}")
    if number < 0:
        raise UnitError(f"{shown(value)} is negative; {what} must be >= 0")
    return number


def _unitless(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    return isinstance(value, str) and re.fullmatch(rf"\s*{_NUMBER}\s*", value) is not None


#: The range of each quantity a device, link or cost can have, in SI units, and in
#: words; a field's value outside it (zero aside) is refused. Sizes: a byte to an EiB
#: (a GPU holds at most a few hundred GB). Bandwidths: 1 kB/s to 1 PB/s (a B200's HBM
#: moves 8 TB/s, an NVLink 5 port 900 GB/s). FLOP rates: 1 MFLOP/s to 1 EFLOP/s (a B200
#: reaches about 10 PFLOP/s in FP4). Times: a picosecond to a minute (latencies and
#: per-op costs are nanoseconds to milliseconds).
PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    "size": (1.0, 2.0**60, "1 B to 1 EiB"),
    "bandwidth": (1e3, 1e15, "1 kB/s to 1 PB/s"),
    "FLOP rate": (1e6, 1e18, "1 MFLOP/s to 1 EFLOP/s"),
    "time": (1e-12, 60.0, "1 ps to 60 s"),
    # a run's durations: a millisecond (an asynchronous checkpoint's stall) to ten years
    "duration": (1e-3, 3.2e8, "1 ms to 10 years"),
    # a GPU board draws watts to a few kW (a GB300 1.4 kW); clocks are MHz to a few GHz
    "power": (1.0, 1e5, "1 W to 100 kW"),
    "frequency": (1e6, 1e10, "1 MHz to 10 GHz"),
}


def _field(
    parse: Callable[[Any], float],
    what: str,
    example: str,
    low: float,
    high: float,
    quantity: str,
) -> Callable[[Any], float]:
    """``parse`` for a scenario field: a bare number outside ``[low, high)`` (zero
    aside) asks for a unit, and any value outside the ``quantity``'s
    :data:`PLAUSIBLE` range (zero aside) is refused."""

    def check(value: Any) -> float:
        smallest, largest, span = PLAUSIBLE[quantity]
        number = parse(value)
        if number == 0:
            return number
        if _unitless(value) and not low <= number < high:
            raise UnitError(
                f"a bare number is read in {what}, and {number:g} {what} is implausible "
                f"here; give a unit, e.g. {example}"
            )
        if not smallest <= number <= largest:
            read = f"{number:g} {what}"
            subject = read if _unitless(value) else f"{shown(value)} ({read})"
            raise UnitError(f"{subject} is not a plausible {quantity}: parasim reads {span}, or 0")
        return number

    return check


def parse_bytes(value: Any) -> float:
    """Bytes from ``"80 GiB"``, ``"80 GB"``, ``"40MB"``, ``"1.5 KiB"`` or a number."""
    return _parse(value, _BYTE_UNITS, "a size in bytes", "'80 GiB', '80 GB' or 1024")


def parse_bandwidth(value: Any) -> float:
    """Bytes/s from ``"450 GB/s"``, ``"200 Gb/s"`` (bits), ``"400 Gbps"``, ``"25 GiB/s"``."""
    return _parse(value, _BANDWIDTH_UNITS, "a bandwidth", "'450 GB/s' or '200 Gb/s'")


def parse_time(value: Any) -> float:
    """Seconds from ``"1.5 us"`` (or ``"1.5 µs"``), ``"600 ns"``, ``"2 ms"``, ``"1 s"``."""
    return _parse(value, _TIME_UNITS, "a time", "'1.5 us', '600 ns' or '2 ms'")


def parse_duration(value: Any) -> float:
    """Seconds from ``"90 s"``, ``"10 min"``, ``"3 h"``, ``"2 days"`` or a number."""
    return _parse(value, _DURATION_UNITS, "a duration", "'10 min', '3 h' or '2 days'")


def parse_flops(value: Any) -> float:
    """FLOP/s from ``"312 TFLOP/s"``, ``"989.4 TFLOPS"``, ``"1 PFLOP/s"`` or a number."""
    return _parse(
        value, _FLOP_UNITS, "a FLOP rate", "'312 TFLOP/s' or '989 TFLOPS'", fold_case=True
    )


def parse_power(value: Any) -> float:
    """Watts from ``"700 W"``, ``"1.2 kW"`` or a number."""
    return _parse(value, _POWER_UNITS, "a power", "'700 W' or '1.2 kW'")


def parse_frequency(value: Any) -> float:
    """Hertz from ``"1830 MHz"``, ``"1.41 GHz"`` or a number."""
    return _parse(value, _FREQUENCY_UNITS, "a frequency", "'1830 MHz' or '1.41 GHz'")


Bytes = Annotated[
    float,
    BeforeValidator(_field(parse_bytes, "bytes", "'80 GiB'", 1e6, math.inf, "size")),
]
"""A size in bytes; accepts ``"80 GiB"``-style text (a bare number: 1 MB or more)."""

Bandwidth = Annotated[
    float,
    BeforeValidator(
        _field(parse_bandwidth, "bytes/s", "'450 GB/s' or '400 Gb/s'", 1e6, math.inf, "bandwidth")
    ),
]
"""A rate in bytes/s; accepts ``"450 GB/s"`` and ``"200 Gb/s"``-style text (a bare
number: 1 MB/s or more)."""

Seconds = Annotated[
    float, BeforeValidator(_field(parse_time, "s", "'1.5 us' or '2 ms'", 0.0, 1.0, "time"))
]
"""A duration in seconds; accepts ``"1.5 us"``-style text (a bare number: under 1 s)."""

Duration = Annotated[
    float,
    BeforeValidator(_field(parse_duration, "s", "'10 min' or '3 h'", 1e-3, 3.2e8, "duration")),
]
"""A run's duration in seconds; accepts ``"10 min"``, ``"3 h"``, ``"2 days"``-style text."""

FlopRate = Annotated[
    float,
    BeforeValidator(_field(parse_flops, "FLOP/s", "'989 TFLOP/s'", 1e9, math.inf, "FLOP rate")),
]
"""A compute rate in FLOP/s; accepts ``"312 TFLOP/s"``-style text (a bare number: 1
GFLOP/s or more)."""


Watts = Annotated[
    float, BeforeValidator(_field(parse_power, "W", "'700 W'", 1.0, math.inf, "power"))
]
"""A power in watts; accepts ``"700 W"``-style text (a bare number: 1 W or more)."""

Hertz = Annotated[
    float,
    BeforeValidator(_field(parse_frequency, "Hz", "'1830 MHz'", 1e6, math.inf, "frequency")),
]
"""A clock in hertz; accepts ``"1830 MHz"``-style text (a bare number: 1 MHz or more)."""


def _scaled(value: float, steps: list[tuple[float, str]], fmt: Callable[[float], str]) -> str:
    """``value`` in the largest unit of ``steps`` (factor, name) it reaches."""
    for factor, name in steps:
        if abs(value) >= factor:
            return f"{fmt(value / factor)} {name}"
    factor, name = steps[-1]
    return f"{fmt(value / factor)} {name}"


def _sig(x: float) -> str:
    return f"{x:.4g}"


def format_bytes(n: float, binary: bool = True) -> str:
    """``85899345920`` -> ``"80.0 GiB"`` (``binary=False``: ``"85.9 GB"``)."""
    if binary:
        steps = [(2.0**e, f"{p}iB") for e, p in ((50, "P"), (40, "T"), (30, "G"), (20, "M"))]
        steps += [(2.0**10, "KiB")]
    else:
        steps = [(10.0**e, f"{p}B") for e, p in ((15, "P"), (12, "T"), (9, "G"), (6, "M"))]
        steps += [(1e3, "kB")]
    steps.append((1.0, "B"))
    if abs(n) < 1024:
        return f"{n:g} B"
    return _scaled(n, steps, lambda x: f"{x:.1f}")


def format_bandwidth(bytes_per_s: float, bits: bool = False) -> str:
    """``450e9`` -> ``"450 GB/s"``; with ``bits=True``, ``25e9`` -> ``"200 Gb/s"``."""
    value, unit = (bytes_per_s * 8, "b/s") if bits else (bytes_per_s, "B/s")
    steps = [(10.0**e, f"{p}{unit}") for e, p in ((15, "P"), (12, "T"), (9, "G"), (6, "M"))]
    steps += [(1e3, f"k{unit}"), (1.0, unit)]
    return _scaled(value, steps, _sig)


def format_time(seconds: float) -> str:
    """``1.5e-6`` -> ``"1.5 us"``; picks ns, us, ms or s."""
    steps = [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]
    if seconds == 0:
        return "0 s"
    return _scaled(seconds, steps, _sig)


def format_flops(flop_per_s: float) -> str:
    """``312e12`` -> ``"312 TFLOP/s"``."""
    steps = [(10.0**e, f"{p}FLOP/s") for e, p in ((18, "E"), (15, "P"), (12, "T"), (9, "G"))]
    steps += [(1e6, "MFLOP/s"), (1e3, "kFLOP/s"), (1.0, "FLOP/s")]
    return _scaled(flop_per_s, steps, _sig)
