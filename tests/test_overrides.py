"""``--set key.path=value``: values read as YAML, the plain ints and words without the
YAML parser (:func:`simulator.request.scenario._read_value`), with the same result."""

from __future__ import annotations

import pytest
import yaml

from simulator.common.errors import ScenarioError
from simulator.request.scenario import _read_value, apply_overrides


@pytest.mark.parametrize(
    "text",
    [
        "8",
        "0",
        "-3",
        "012",
        "0x10",
        "1_000",
        "1e3",
        "1.5",
        ".inf",
        "tp",
        "zb-h1",
        "flow",
        "yes",
        "No",
        "ON",
        "off",
        "true",
        "False",
        "null",
        "NULL",
        "~",
        "y",
        "n",
        "a b",
        "[tp, dp, pp]",
        "[tp,dp,pp]",
        "[6, 6, 7]",
        "[ 1 , -2 ]",
        "[]",
        "[ ]",
        "[on, off, ~, null, yes]",
        "[012, 1]",
        "[a-b, c_d]",
        "[1e3]",
        "[x:y]",
        "[y, n]",
        "[[1]]",
        "{experts: 4, top_k: 2}",
        "'8'",
        "80GB",
        "12 GiB",
        "-",
        "_x",
        "x:y",
    ],
)
def test_a_value_reads_as_yaml_reads_it(text):
    expected = yaml.safe_load(text)
    value = _read_value(text)
    assert value == expected and type(value) is type(expected)


def test_overrides_set_nested_keys_on_a_copy():
    raw = {"parallel": {"tp": 1}, "model": {"name": "m"}}
    out = apply_overrides(raw, ["parallel.tp=8", "parallel.schedule=zb-h1", "model.moe.experts=4"])
    assert out == {
        "parallel": {"tp": 8, "schedule": "zb-h1"},
        "model": {"name": "m", "moe": {"experts": 4}},
    }
    assert raw == {"parallel": {"tp": 1}, "model": {"name": "m"}}
    with pytest.raises(ScenarioError, match="expected key.path=value"):
        apply_overrides(raw, ["parallel.tp"])


def test_a_value_of_many_digits_is_refused_not_converted():
    """The plain-integer fast path leaves a number longer than any field to the YAML
    reader, which refuses it in one line (Python's int() would raise on 4,301 digits)."""
    assert _read_value("1" * 40) == int("1" * 40)
    for digits in (41, 4301):
        with pytest.raises(ScenarioError, match=rf"^--set parallel.tp: a number of {digits} "):
            apply_overrides({}, ["parallel.tp=" + "1" * digits])


def test_an_unreadable_value_names_its_key():
    with pytest.raises(ScenarioError, match=r"^--set parallel.placement: not valid YAML \("):
        apply_overrides({}, ["parallel.placement=[tp, dp"])


@pytest.mark.parametrize("assignment", ["training..global_batch=1", ".parallel.tp=2", "tp.=2"])
def test_an_empty_key_in_an_override_is_refused(assignment):
    with pytest.raises(ScenarioError, match="an empty key"):
        apply_overrides({"training": {"global_batch": 16}}, [assignment])
