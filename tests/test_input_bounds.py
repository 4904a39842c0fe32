"""Every text parasim reads is bounded before it is built (nesting, values, lengths,
digits, keys given twice), every measured table and unit field is checked as strictly
as the scenario, and nothing raw reaches the terminal."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from simulator.cli.main import LONGEST_ERROR_LINE, error_line, main
from simulator.common.errors import ParasimError, ScenarioError
from simulator.common.vocabulary import COLLECTIVE_KINDS
from simulator.request.scenario import apply_overrides, load_scenario
from simulator.tools.sweep import parse_fixes
from topologies import TopologyError, load_cluster_spec
from topologies.build import PRESET_DIR, _read_preset, preset_names
from topologies.config_text import (
    DEEPEST_NESTING,
    LONGEST_NUMBER,
    LONGEST_SCALAR,
    MOST_VALUES,
    ConfigTextError,
    read_json,
    read_yaml,
)
from topologies.files import LARGEST_SCENARIO
from topologies.spec import COMM_KINDS, LARGEST_TABLE
from topologies.validation import FOREIGN_NAMES, shown

from .conftest import SCENARIOS
from .helpers import A100_PROFILE

SMALL = SCENARIOS / "small.yaml"


def refusal(text: str, **kwargs) -> str:
    with pytest.raises(ConfigTextError) as info:
        read_yaml(text, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------- YAML text


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: [1, 2.5, yes, ~, '3', x]\nc: {d: {e: [f, g]}}\n",
        "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nlist: [*b, *b]\n",
        "- 1\n- -2\n- 0x10\n- 1_000\n- .inf\n- 2001-12-14\n",
        "text: |\n  two\n  lines\nkey with spaces: 'q'\n",
        "",
    ],
)
def test_what_is_within_the_bounds_reads_as_yaml_reads_it(text):
    assert read_yaml(text) == yaml.safe_load(text)


def test_every_preset_reads_as_before():
    for name in preset_names():
        assert _read_preset(name) == yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())


@pytest.mark.parametrize(
    "junk",
    [
        "[" * 20_000 + "1" + "]" * 20_000,
        "{a: " * 20_000 + "1" + "}" * 20_000,
        "\n" + "".join(f"{' ' * (i + 1)}k{i}:\n" for i in range(3_000)) + " " * 3_001 + "1",
    ],
    ids=["flow-list", "flow-map", "block"],
)
def test_deep_nesting_is_refused_naming_the_path(junk):
    message = refusal(f"name: x\njunk: {junk}\n", source="s.yaml")
    assert message.startswith("junk")
    assert f"nested more than {DEEPEST_NESTING} levels deep" in message
    assert "(s.yaml line " in message
    assert len(message) < 300  # the path is cut in its middle


def test_nesting_up_to_the_bound_is_read():
    depth = DEEPEST_NESTING - 1
    assert read_yaml("a: " + "[" * depth + "]" * depth) is not None


def test_too_many_values_are_refused_where_the_bound_is_reached():
    message = refusal("junk: [" + ", ".join(["0"] * (MOST_VALUES + 10)) + "]\n")
    # the walk stops at the bound (the mapping and the list count too, not the key that
    # names the list), not at the end of the list
    assert message.startswith(f"junk[{MOST_VALUES - 2}]")
    assert f"more than {MOST_VALUES} values" in message


def test_an_alias_bomb_counts_what_it_expands_to():
    lines = ['b0: &b0 ["lol", "lol"]']
    lines += [f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 9) + "]" for i in range(1, 9)]
    message = refusal("\n".join(lines) + "\n")
    assert f"more than {MOST_VALUES} values" in message
    assert "aliases counted" in message
    # a few aliases of a small anchor are fine
    assert read_yaml("a: &a [1, 2]\nb: [*a, *a, *a]\n")["b"] == [[1, 2]] * 3


def test_an_alias_repeats_the_nesting_of_its_anchor():
    depth = DEEPEST_NESTING - 2
    text = "a: &deep " + "[" * depth + "]" * depth + "\nb: [[*deep]]\n"
    assert "b[0][0]" in refusal(text)


def test_a_long_value_is_refused_before_it_is_built():
    message = refusal("name: " + "x" * (LONGEST_SCALAR + 1) + "\n")
    assert message == (
        f"name: a value of {LONGEST_SCALAR + 1} characters; parasim reads at most {LONGEST_SCALAR}"
    )


@pytest.mark.parametrize("number", ["1" * 4301, "9" * 400, "1." + "5" * 60, "-" + "7" * 41])
def test_a_number_of_too_many_digits_is_refused(number):
    message = refusal(f"training:\n  global_batch: {number}\n", source="s.yaml")
    assert message.startswith("training.global_batch (s.yaml line 2): a number of")
    assert f"no field takes more than {LONGEST_NUMBER}" in message
    assert read_yaml(f"x: '{number}'")["x"] == number  # a quoted string stays a string


@pytest.mark.parametrize(
    "text,path",
    [
        ("training:\n  global_batch: 16\n  global_batch: 64\n", "training.global_batch"),
        ("training: {micro_batch: 1, 'micro_batch': 2}\n", "training.micro_batch"),
        ("a: 1\nb: 2\na: 3\n", "a"),
        ("m: {1: x, 0x1: y}\n", "m.0x1"),
        ("m: {true: x, yes: y}\n", "m.yes"),
    ],
)
def test_a_key_given_twice_is_refused_with_both_lines(text, path):
    message = refusal(text, source="s.yaml")
    assert message.startswith(f"{path} (s.yaml line ")
    assert "given twice in one mapping, first at line" in message


def test_keys_that_differ_in_what_yaml_reads_are_distinct():
    assert read_yaml("m: {1: x, '1': y}\n") == {"m": {1: "x", "1": "y"}}


def test_a_key_that_is_a_list_is_refused():
    assert "a key that is a list or a mapping" in refusal("? [1, 2]\n: x\n")


def test_bad_yaml_names_the_line_and_the_problem():
    message = refusal("a: b: c\n", source="s.yaml")
    assert message.startswith("s.yaml: not valid YAML at line 1 (")


# ------------------------------------------------------------------------------ files


def write_scenario(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_scenario_is_read_within_its_own_size_bound(tmp_path):
    path = write_scenario(tmp_path, SMALL.read_text() + "# " + "x" * LARGEST_SCENARIO + "\n")
    with pytest.raises(ScenarioError, match=rf"\({LARGEST_SCENARIO} at most\)\)$"):
        load_scenario(path)


def test_a_duplicate_key_in_a_scenario_names_the_field(tmp_path):
    text = SMALL.read_text().replace("micro_batch: 4", "micro_batch: 4\n  micro_batch: 2")
    with pytest.raises(ScenarioError, match=r"^training.micro_batch \(.*s.yaml line \d+\): given"):
        load_scenario(write_scenario(tmp_path, text))


def test_a_topology_file_is_bounded_under_its_field(tmp_path):
    topology = (SCENARIOS.parent / "topologies/examples/switch-ring-2d.yaml").read_text()
    (tmp_path / "topo.yaml").write_text(topology + "\nname: twice\n")
    with pytest.raises(TopologyError, match=r"^cluster.topology.name \(topo.yaml line \d+\)"):
        load_cluster_spec({"topology": "topo.yaml"}, base_dir=tmp_path)


def test_set_and_fix_values_are_bounded(tmp_path):
    with pytest.raises(ScenarioError, match=r"^--set training.global_batch: a number of 4301"):
        apply_overrides({}, ["training.global_batch=" + "1" * 4301])
    with pytest.raises(ScenarioError, match=r"^--set model.moe\.junk\[0\]\[0\].*nested more"):
        apply_overrides({}, ["model.moe={junk: " + "[" * 100 + "]" * 100 + "}"])
    with pytest.raises(ParasimError, match=r"^--fix tp: a number of 500 digits"):
        parse_fixes(["tp=" + "9" * 500])


# ------------------------------------------------------------------------------ JSON


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"a": NaN}', "p: NaN is not a number JSON has"),
        ('{"a": -Infinity}', "p: -Infinity is not a number JSON has"),
        ('{"a": 1e999}', "p: 1e999 is beyond a float's range"),
        ('{"a": ' + "1" * 500 + "}", "p: a number of 500 digits"),
        ('{"a": 1, "a": 2}', "p: key 'a' given twice in one object"),
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "p: nested more than"),
        ('{"a": ' + "[" * 80 + "]" * 80 + "}", "p.a[0][0]"),
        ('{"a": "' + "x" * (LONGEST_SCALAR + 1) + '"}', f"p.a: a value of {LONGEST_SCALAR + 1}"),
        (json.dumps({"a": [0] * (MOST_VALUES + 1)}), f"p: more than {MOST_VALUES} values"),
        (json.dumps({f"k{i}": "v" for i in range(MOST_VALUES)}), "p: more than"),
        ("{x", "p is not JSON (line 1: "),
    ],
)
def test_json_is_bounded_like_yaml(text, expected):
    with pytest.raises(ConfigTextError) as info:
        read_json(text, "p")
    assert str(info.value).startswith(expected)


def test_json_strings_full_of_commas_are_not_counted_as_values():
    text = json.dumps({"note": "," * (LONGEST_SCALAR - 10), "more": ["a,b"] * 20_000})
    assert len(read_json(text)["more"]) == 20_000


def profile_error(tmp_path, payload) -> str:
    path = tmp_path / "prof.json"
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    with pytest.raises(TopologyError) as info:
        load_cluster_spec({"preset": "dgx-a100", "nodes": 1, "profile": str(path)})
    return str(info.value)


@pytest.mark.parametrize("text", ["[]", "[1, 2]", "null", '"x"', "3"])
def test_a_profile_that_is_not_an_object_is_refused(tmp_path, text):
    assert "is not a parasim calibration profile (" in profile_error(tmp_path, text)


def _set(payload, path, value):
    node = payload
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@pytest.mark.parametrize(
    "path,value,expected",
    [
        (("gpu", "gemm_table"), [[0, 64, 64, 0.5]], "gpu.gemm_table[0][0]: a GEMM dimension"),
        (("gpu", "gemm_table"), [[1e300, 64, 64, 0.5]], "gpu.gemm_table[0][0]: a GEMM dimension"),
        (("gpu", "gemm_table"), [[64.5, 64, 64, 0.5]], "gpu.gemm_table[0][0]: a GEMM dimension"),
        (("gpu", "gemm_table"), [[-64, 64, 64, 0.5]], "gpu.gemm_table[0][0]: a GEMM dimension"),
        (("gpu", "gemm_table"), [[64, 64, 64, 0]], "gpu.gemm_table[0][3]: must be a fraction"),
        (("gpu", "gemm_table"), [[64, 64, 64, -0.5]], "gpu.gemm_table[0][3]: must be a fraction"),
        (("gpu", "gemm_table"), [[64, 64, 64, 1.5]], "gpu.gemm_table[0][3]: must be a fraction"),
        (("gpu", "gemm_table"), [[64, 64, 64]], "gpu.gemm_table[0][3]: required field"),
        (("gpu", "gemm_table"), [[64, 64, 64, 0.5]] * (LARGEST_TABLE + 1), "at most 10000"),
        (("gpu", "peak_flops"), 1e300, "gpu.peak_flops: 1e+300 FLOP/s is not a plausible"),
        (("gpu", "kernel_launch_overhead"), 5, "gpu.kernel_launch_overhead: a bare number"),
        (
            ("gpu", "op_table"),
            [{"kind": "gemm", "flops": 1e300, "bytes": 0, "seconds": 1}],
            "flops",
        ),
        (("gpu", "op_table"), [{"kind": "gemm", "flops": 1, "bytes": 0, "seconds": 1e-300}], "sec"),
        (("comm", "all_reduce", "intra_node", "alpha"), 1e30, "alpha: a bare number is read in s"),
        (("comm", "all_reduce", "intra_node", "bandwidth"), 1e300, "not a plausible bandwidth"),
        (("comm", "all_reduce", "intra_node", "points"), 1, "points: a fit needs at least 2"),
        (("comm", "all_reduce", "intra_node", "table"), [{"ranks": 2, "bytes": 1}], "seconds"),
        (("comm", "all_reduce", "inside"), {}, "comm.all_reduce.inside"),
        (("comm", "all_reduse"), {}, "comm.all_reduse"),
        (("device", "count"), 10**30, "device.count: 1e+30 is too large"),
    ],
)
def test_profile_fields_are_checked_as_strictly_as_the_scenario(tmp_path, path, value, expected):
    payload = copy.deepcopy(A100_PROFILE)
    _set(payload, path, value)
    message = profile_error(tmp_path, payload)
    assert message.startswith("cluster.profile (prof.json")
    assert expected in message


def test_the_profile_and_the_cluster_fit_the_same_communication_kinds():
    assert COMM_KINDS == (*COLLECTIVE_KINDS, "p2p")


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("cluster.gpu.gemm_table", "[[4096, 4096, 0, 0.5]]", "gemm_table[0][2]: a GEMM dimension"),
        ("cluster.gpu.gemm_table", "[[4096, 4096, 64, 0]]", "gemm_table[0][3]: must be a fraction"),
        ("cluster.gpu.matmul_efficiency", "1.0e-300", "must be a fraction of peak in [1e-06, 1]"),
        ("cluster.nvswitch.link_efficiency", "1.0e-300", "must be a fraction of peak"),
        ("cluster.network.oversubscription", "1.0e+300", "must be a ratio from 1/1024 to 1024"),
        ("cluster.gpu.gemm_k_overhead", "1.0e+300", "less than or equal to 65536"),
        ("cluster.gpu.op_table", "[{kind: x, flops: 1, bytes: 1, seconds: 0}]", "op_table[0]"),
    ],
)
def test_scenario_cluster_fields_that_gave_nonsense_are_refused(field, value, expected):
    with pytest.raises(ScenarioError) as info:
        load_scenario(SMALL, [f"{field}={value}"])
    assert str(info.value).startswith(field) and expected in str(info.value)


# ------------------------------------------------------------------------ the terminal


@pytest.mark.parametrize(
    "raw,seen",
    [
        ("\x1b]0;PWNED\x07\x1b[2J", r"\x1b]0;PWNED\x07\x1b[2J"),
        ("a\u202eb", r"a\u202eb"),
        ("\x9b31m\x7f\x00", r"\x9b31m\x7f\x00"),
        ("tab\tnew\nline\rend", r"tab\x09new\x0aline\x0dend"),
        ("zero\u200bwidth\u2028", r"zero\u200bwidth\u2028"),
        ("déjà 中文 naïve", "déjà 中文 naïve"),
    ],
)
def test_an_error_line_quotes_every_control_character(raw, seen):
    assert error_line(ValueError(f"key {raw}: unknown")) == f"key {seen}: unknown"


def test_an_error_line_cuts_long_values_and_stays_short():
    line = error_line(ValueError("name: " + "x" * 1_000_000 + " is wrong"))
    assert line.startswith("name: xxx") and line.endswith("xxx is wrong")
    assert "characters left out]" in line and len(line) < 250
    long = error_line(ValueError(" ".join(["word"] * 1000)))
    assert len(long) <= LONGEST_ERROR_LINE and "characters left out]" in long
    assert error_line(ValueError("plain: fine (got 3)")) == "plain: fine (got 3)"


def test_the_command_line_prints_through_error_line(tmp_path, capsys):
    text = SMALL.read_text() + '"\\e]0;PWNED\\a\\e[2J": 1\n'
    path = write_scenario(tmp_path, text)
    assert main(["run", str(path), "--outputs", "result", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("parasim: error: \\x1b]0;PWNED\\x07\\x1b[2J: unknown key")
    assert "\x1b" not in err and "\x07" not in err


def test_a_huge_value_is_cut_at_its_source():
    with pytest.raises(ScenarioError) as info:
        load_scenario(SMALL, ["cluster.nic.bandwidth=" + "9" * 5000 + " GB/s"])
    message = str(info.value)
    assert message.startswith("cluster.nic.bandwidth: cannot read '999")
    assert "more characters)" in message and len(message) < 300
    assert shown("x" * 1000) == repr("x" * 80) + "… (920 more characters)"


# ---------------------------------------------------------------------- foreign names


@pytest.mark.parametrize(
    "override,expected",
    [
        ("tensor_model_parallel_size=8", "tensor_model_parallel_size: unknown key (did you "
         "mean 'parallel.tp'? 'tensor_model_parallel_size' is Megatron-LM's name)"),
        ("parallel.pipeline_model_parallel_size=2", "(did you mean 'parallel.pp'?"),
        ("training.seq_length=2048", "(did you mean 'model.seq_len'?"),
        ("training.seq_len=2048", "(did you mean 'model.seq_len'?"),
        ("parallel.micro_batch_size=2", "(did you mean 'training.micro_batch'?"),
        ("parallel.data_parallel_shard_degree=2", "(did you mean 'parallel.dp_shard'? "),
        ("training.zero_stage=3", "(did you mean 'training.sharding'? 'zero_stage' is DeepSpeed"),
        ("model.num_hidden_layers=4", "(did you mean 'model.layers'? 'num_hidden_layers' is Hu"),
        ("cluster.tensor_parallel_degree=2", "(did you mean 'parallel.tp'? "),
    ],
)  # fmt: skip
def test_another_frameworks_name_points_to_parasims_field(override, expected):
    with pytest.raises(ScenarioError) as info:
        load_scenario(SMALL, [override])
    assert expected in str(info.value)


def test_every_foreign_name_maps_to_a_real_field():
    for name, (field, project) in FOREIGN_NAMES.items():
        assert project in ("Megatron-LM", "torchtitan", "DeepSpeed", "Hugging Face"), name
        section, _, rest = field.partition(".")
        assert section in ("parallel", "training", "model", "simulation"), field
        overrides = [f"{field}=null"] if rest else []
        try:
            load_scenario(SMALL, overrides)
        except ScenarioError as exc:
            assert "unknown key" not in str(exc), (name, field, str(exc))


@pytest.mark.parametrize(
    "override,field",
    [
        ('name="\\e]0;PWNED\\a"', "name"),
        ('model.name="a\\u202eb"', "model.name"),
        ('description="\\e[2J"', "description"),
        ('cluster.gpu.name="\\x9b31m"', "cluster.gpu.name"),
    ],
)
def test_a_name_the_summary_prints_holds_no_control_character(override, field):
    with pytest.raises(ScenarioError) as info:
        load_scenario(SMALL, [override])
    assert str(info.value).startswith(f"{field}: holds the control character ")
    assert "\x1b" not in str(info.value) and "\u202e" not in str(info.value)


def test_a_description_may_hold_lines_and_a_name_is_bounded():
    scenario = load_scenario(SMALL, ['description="two\\n\\tlines"'])
    assert scenario.spec.description == "two\n\tlines"
    with pytest.raises(ScenarioError, match=r"^name: 300 characters; at most 256"):
        load_scenario(SMALL, ["name=" + "x" * 300])
