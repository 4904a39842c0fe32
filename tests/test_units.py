"""The units parser: every accepted form, bits against bytes, binary against decimal,
and the one-line errors for text it cannot read."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from simulator.common.errors import ScenarioError
from simulator.request.scenario import load_scenario
from topologies.units import (
    Bandwidth,
    Bytes,
    FlopRate,
    Seconds,
    UnitError,
    format_bandwidth,
    format_bytes,
    format_flops,
    format_time,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_time,
)

from .conftest import SCENARIOS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80 GiB", 80 * 2**30),
        ("80 GB", 80e9),
        ("40MB", 40e6),
        ("25 MiB", 25 * 2**20),
        ("1.5 KiB", 1536),
        ("2 kB", 2000),
        ("1 TB", 1e12),
        ("1 TiB", 2**40),
        ("512 B", 512),
        ("1e9", 1e9),
        ("64 bytes", 64),
        (4096, 4096),
        (1.5e3, 1500),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == pytest.approx(expected)


def test_binary_and_decimal_prefixes_differ():
    assert parse_bytes("1 GiB") / parse_bytes("1 GB") == pytest.approx(1.073741824)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("450 GB/s", 450e9),
        ("200 Gb/s", 25e9),
        ("400 Gbps", 50e9),
        ("25 GBps", 25e9),
        ("3.35 TB/s", 3.35e12),
        ("1 GiB/s", 2**30),
        ("100 Mb/s", 12.5e6),
        ("0 GB/s", 0.0),
        (12.5e9, 12.5e9),
    ],
)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


def test_bits_are_an_eighth_of_bytes():
    assert parse_bandwidth("200 Gb/s") * 8 == pytest.approx(parse_bandwidth("200 GB/s"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5 us", 1.5e-6),
        ("1.5 \u00b5s", 1.5e-6),
        ("1.5 \u03bcs", 1.5e-6),
        ("600 ns", 600e-9),
        ("2 ms", 2e-3),
        ("3 s", 3.0),
        ("0.25", 0.25),
        (1e-6, 1e-6),
    ],
)
def test_parse_time(text, expected):
    assert parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("312 TFLOP/s", 312e12),
        ("989.4 TFLOPS", 989.4e12),
        ("1 PFLOP/s", 1e15),
        ("225 TFLOPs/s", 225e12),
        ("50 GFLOP/s", 50e9),
        (1e12, 1e12),
    ],
)
def test_parse_flops(text, expected):
    assert parse_flops(text) == pytest.approx(expected)


def test_error_names_the_text_and_the_expected_form():
    with pytest.raises(UnitError) as info:
        parse_bandwidth("450 GX/s")
    assert str(info.value) == (
        "cannot read '450 GX/s' as a bandwidth (expected e.g. '450 GB/s' or '200 Gb/s')"
    )
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("parse", "bad"),
    [
        (parse_bytes, "80 Gb"),  # bits are not a size in bytes
        (parse_bytes, "80 gigs"),
        (parse_bytes, "GB"),
        (parse_bytes, True),
        (parse_bytes, None),
        (parse_bandwidth, "450 GB"),  # a size, not a rate
        (parse_time, "5 minutes"),
        (parse_time, "1.5 u s"),
        (parse_flops, "312 TB/s"),
        (parse_flops, [312]),
    ],
)
def test_unreadable_values_raise(parse, bad):
    with pytest.raises(UnitError, match="cannot read"):
        parse(bad)


@pytest.mark.parametrize(
    ("parse", "bad"),
    [
        (parse_bytes, "-1 GB"),
        (parse_bandwidth, -25e9),
        (parse_time, "-2 us"),
        (parse_flops, "-1 TFLOP/s"),
    ],
)
def test_negative_values_raise(parse, bad):
    with pytest.raises(UnitError, match="negative"):
        parse(bad)


def test_non_finite_values_raise():
    with pytest.raises(UnitError, match="finite"):
        parse_time(float("inf"))


class _Fields(BaseModel):
    size: Bytes
    rate: Bandwidth
    delay: Seconds
    compute: FlopRate


def test_pydantic_types_parse_human_units():
    fields = _Fields(size="80 GiB", rate="200 Gb/s", delay="1.5 us", compute="312 TFLOP/s")
    assert fields.size == 80 * 2**30
    assert fields.rate == 25e9
    assert fields.delay == pytest.approx(1.5e-6)
    assert fields.compute == 312e12


def test_pydantic_types_report_the_unit_error():
    with pytest.raises(ValidationError, match="cannot read '5 parsecs' as a time"):
        _Fields(size=1, rate=1, delay="5 parsecs", compute=1)


def test_format_helpers():
    assert format_bytes(80 * 2**30) == "80.0 GiB"
    assert format_bytes(80e9, binary=False) == "80.0 GB"
    assert format_bytes(512) == "512 B"
    assert format_bandwidth(450e9) == "450 GB/s"
    assert format_bandwidth(25e9, bits=True) == "200 Gb/s"
    assert format_time(600e-9) == "600 ns"
    assert format_time(1.5e-6) == "1.5 us"
    assert format_time(2.5e-3) == "2.5 ms"
    assert format_time(3.0) == "3 s"
    assert format_flops(312e12) == "312 TFLOP/s"
    assert format_flops(989.4e12) == "989.4 TFLOP/s"


@pytest.mark.parametrize(
    ("fmt", "parse", "value"),
    [
        (format_bandwidth, parse_bandwidth, 450e9),
        (format_time, parse_time, 1.5e-6),
        (format_flops, parse_flops, 312e12),
        (format_bytes, parse_bytes, 80 * 2**30),
    ],
)
def test_formatted_values_parse_back(fmt, parse, value):
    assert parse(fmt(value)) == pytest.approx(value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("cluster.nic.bandwidth", 450),
        ("cluster.nvswitch.bandwidth", "900"),
        ("cluster.gpu.hbm_capacity", 80),
        ("cluster.gpu.peak_flops", 989.4),
        ("cluster.gpu.kernel_launch_overhead", 4),
    ],
)
def test_a_bare_number_that_is_implausible_in_the_base_unit_asks_for_a_unit(field, value):
    with pytest.raises(ScenarioError, match=rf"^{field}: a bare number is read in .*give a unit"):
        load_scenario(SCENARIOS / "small.yaml", [f"{field}={value}"])


def test_plausible_bare_numbers_and_zero_pass():
    scenario = load_scenario(
        SCENARIOS / "small.yaml",
        ["cluster.nic.bandwidth=50e9", "cluster.gpu.kernel_launch_overhead=0"],
    )
    assert scenario.cluster_spec.nic.bandwidth == 50e9
    assert scenario.cluster_spec.gpu.kernel_launch_overhead == 0
    assert parse_bandwidth(450) == 450  # the parser itself takes any number (CLI sizes)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("cluster.gpu.peak_flops", "1e-300 TFLOP/s", "'1e-300 TFLOP/s' (1e-288 FLOP/s) is not a "
         "plausible FLOP rate: parasim reads 1 MFLOP/s to 1 EFLOP/s, or 0"),
        ("cluster.nic.bandwidth", "1e400 GB/s", "'1e400 GB/s' is not a finite bandwidth"),
        ("cluster.nic.bandwidth", "-5 GB/s", "'-5 GB/s' is negative; a bandwidth must be >= 0"),
        ("cluster.nic.bandwidth", "nan GB/s", "cannot read 'nan GB/s' as a bandwidth"),
        ("cluster.nvswitch.bandwidth", "1e300", "1e+300 bytes/s is not a plausible bandwidth"),
        ("cluster.nvswitch.bandwidth", "5000 PB/s", "(5e+18 bytes/s) is not a plausible"),
        ("cluster.nic.latency", "1e30 s", "'1e30 s' (1e+30 s) is not a plausible time"),
        ("cluster.nic.latency", "1e-30 us", "(1e-36 s) is not a plausible time"),
        ("cluster.gpu.hbm_capacity", "0.000001 B", "(1e-06 bytes) is not a plausible size"),
        ("cluster.gpu.hbm_capacity", "2 ZB", "cannot read '2 ZB' as a size in bytes"),
    ],
)  # fmt: skip
def test_a_value_with_a_unit_is_as_plausible_as_a_bare_number(field, value, message):
    with pytest.raises(ScenarioError) as info:
        load_scenario(SCENARIOS / "small.yaml", [f"{field}={value}"])
    text = str(info.value)
    assert text.startswith(f"{field}: ") and message in text


def test_plausible_values_with_units_and_zero_pass():
    fields = _Fields(size="512 KiB", rate="1 kB/s", delay="0 us", compute="1 EFLOP/s")
    assert (fields.size, fields.rate, fields.delay, fields.compute) == (2.0**19, 1e3, 0, 1e18)
