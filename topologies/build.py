"""From a scenario's ``cluster:`` block to a built :class:`~topologies.cluster.Cluster`.

A scenario names a preset and the number of nodes, and may override any preset field
by giving the same nesting::

    cluster:
      preset: dgx-a100
      nodes: 16
      gpu: {matmul_efficiency: 0.6}
      nic: {bandwidth: "100 Gb/s"}
      network: {pod_size: 4, oversubscription: 2}

:func:`load_cluster_spec` reads the preset YAML from ``topologies/presets/``,
deep-merges the overrides into it (mappings merge key by key, anything else
replaces, ``null`` removes: ``nvswitch: null`` with a ``pcie`` group turns NVLink
nodes into PCIe-only ones) and validates the result as a
:class:`~topologies.spec.ClusterSpec`. Without ``preset`` the block must give every
field itself.

With ``topology`` (a file path or an inline mapping) the fabric comes from a custom
topology instead of a preset; :mod:`topologies.custom` documents that format. Its
nodes and GPUs per node follow from the file, so ``nodes`` and ``gpus_per_node`` are
optional there and, when given, must agree with it.

Any problem becomes one :class:`~topologies.errors.TopologyError` line such as
``cluster.gpu.matmul_effciency: unknown key (did you mean 'matmul_efficiency'?)``.
:func:`build_cluster` then turns the spec into the network graph.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .cluster import Cluster
from .config_text import ConfigTextError, read_yaml
from .custom import read_topology
from .dimensions import DimensionCluster
from .errors import TopologyError
from .fattree import FatTreeCluster
from .graph import GraphCluster
from .profile import load_profile, profile_overrides
from .spec import ClusterSpec, check_cluster_spec
from .validation import (
    nearest_key_hint,
    printable,
    shown,
    unknown_key_hint,
    validation_message,
)

__all__ = ["preset_names", "load_preset", "load_cluster_spec", "build_cluster"]

PRESET_DIR = Path(__file__).parent / "presets"
#: The longest path a profile is named by (Linux's PATH_MAX).
LONGEST_PATH = 4096


def preset_names() -> list[str]:
    """Names of the shipped cluster presets, sorted (``['cpu-localhost', 'dgx-a100', ...]``)."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """The raw mapping of preset ``name`` as written in its YAML file (human units)."""
    names = preset_names()
    if name not in names:
        hint = nearest_key_hint(str(name), names)
        raise TopologyError(f"unknown preset {shown(name)}{hint}; presets: {', '.join(names)}")
    return copy.deepcopy(_read_preset(name))


@functools.cache
def _read_preset(name: str) -> dict[str, Any]:
    """A preset's parsed YAML, read once per process (sweeps load thousands of scenarios)."""
    path = PRESET_DIR / f"{name}.yaml"
    try:
        data = read_yaml(path.read_text(encoding="utf-8"), source=path.name)
    except ConfigTextError as exc:
        raise TopologyError(f"preset {name!r}: {exc}") from None
    if not isinstance(data, dict):
        raise TopologyError(f"preset {name!r}: expected a mapping at the top of {name}.yaml")
    return data


def _deep_merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in; nested mappings merge, other values replace."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_cluster_spec(
    config: Mapping[str, Any], prefix: str = "cluster", base_dir: str | Path | None = None
) -> ClusterSpec:
    """Validate a scenario's ``cluster:`` mapping (preset + nodes + overrides, or a
    custom ``topology``); ``base_dir`` is where a relative topology path is looked up
    first (the scenario's folder)."""
    if not isinstance(config, Mapping):
        raise TopologyError(
            f"{prefix}: expected a mapping such as {{preset: dgx-a100, nodes: 2}} "
            f"(got {shown(config)})"
        )
    valid = ["preset", "profile", *ClusterSpec.model_fields]
    for key in config:
        if key not in valid:
            hint = unknown_key_hint(str(key), valid)
            raise TopologyError(
                f"{prefix}.{key}: unknown key{hint}; valid keys: {', '.join(sorted(valid))}"
            )
    if config.get("topology") is not None:
        return _load_custom(config, prefix, base_dir)
    # a preset with overrides reads no file of the user's: the same mapping is the same
    # (frozen) spec, which a search asks for once per candidate
    spec_key = _spec_key(config, prefix) if config.get("profile") is None else None
    if spec_key is not None:
        known = _PRESET_SPECS.get(spec_key)
        if known is not None:
            return known
    overrides = {k: v for k, v in config.items() if k not in ("preset", "profile", "topology")}
    base: dict[str, Any] = {}
    if "preset" in config:
        try:
            base = load_preset(config["preset"])
        except TopologyError as exc:
            raise TopologyError(f"{prefix}.preset: {exc}") from None
    spec = _validate(base, overrides, config.get("profile"), prefix)
    if spec_key is not None:
        if len(_PRESET_SPECS) >= 64:
            _PRESET_SPECS.clear()
        _PRESET_SPECS[spec_key] = spec
    return spec


#: The specs of preset clusters already validated, by prefix and mapping (as JSON).
_PRESET_SPECS: dict[tuple[str, str], ClusterSpec] = {}


def _spec_key(config: Mapping[str, Any], prefix: str) -> tuple[str, str] | None:
    """The cache key of a preset cluster's mapping; None when it has keys JSON cannot
    sort (a number beside a name: validation says what is wrong with it)."""
    try:
        return prefix, json.dumps(config, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return None


def _validate(
    base: dict[str, Any], overrides: dict[str, Any], profile_source: Any, prefix: str
) -> ClusterSpec:
    """Merge a calibration profile and the overrides into ``base``, validate, check."""
    if profile_source is not None:
        source = str(profile_source)
        try:
            printable(source, LONGEST_PATH)  # the result's note names it
        except ValueError as exc:
            raise TopologyError(f"{prefix}.profile: {exc}") from None
        profile = load_profile(source, f"{prefix}.profile")
        per_node = overrides.get("gpus_per_node", base.get("gpus_per_node"))
        base = _deep_merge(base, profile_overrides(profile, per_node, source, f"{prefix}.profile"))
    try:
        spec = ClusterSpec.model_validate(_deep_merge(base, overrides))
    except ValidationError as exc:
        raise TopologyError(validation_message(exc, ClusterSpec, prefix)) from None
    check_cluster_spec(spec, prefix)
    return spec


def _load_custom(
    config: Mapping[str, Any], prefix: str, base_dir: str | Path | None
) -> ClusterSpec:
    """A ``cluster:`` block with ``topology``: the file gives the fabric, nodes and GPU."""
    for key in ("preset", "nvswitch", "pcie", "nic", "network"):
        if key in config:
            what = (
                "borrow a preset's GPU with gpu_preset in the topology"
                if key == "preset"
                else "the topology gives every link"
            )
            raise TopologyError(f"{prefix}.{key}: not used with {prefix}.topology ({what})")
    where = f"{prefix}.topology"
    custom = read_topology(config["topology"], where, base_dir)
    gpus = custom.nodes * custom.gpus_per_node
    for key, derived in (("nodes", custom.nodes), ("gpus_per_node", custom.gpus_per_node)):
        given = config.get(key)
        if given is not None and given != derived:
            raise TopologyError(
                f"{prefix}.{key}: {key}({shown(given)}) does not match the topology, which has "
                f"{gpus} GPUs on {custom.nodes} nodes of {custom.gpus_per_node}"
            )
    gpu: dict[str, Any] = {}
    if custom.gpu_preset is not None:
        try:
            gpu = dict(load_preset(custom.gpu_preset).get("gpu") or {})
        except TopologyError as exc:
            raise TopologyError(f"{where}.gpu_preset: {exc}") from None
    gpu = _deep_merge(gpu, custom.gpu)
    if not gpu and "gpu" not in config:
        raise TopologyError(
            f"{where}.gpu: required field is missing (give gpu, or gpu_preset to borrow a preset's)"
        )
    base = {
        "name": custom.name,
        "nodes": custom.nodes,
        "gpus_per_node": custom.gpus_per_node,
        "gpu": gpu,
        "topology": custom.topology,
    }
    skip = ("topology", "profile", "nodes", "gpus_per_node")
    overrides = {k: v for k, v in config.items() if k not in skip}
    return _validate(base, overrides, config.get("profile"), prefix)


def build_cluster(spec: ClusterSpec) -> Cluster:
    """The network graph and routing of ``spec``, as the subclass its fabric needs: a
    fat tree for a preset, the per-dimension or explicit graph of a custom topology."""
    if spec.topology is None:
        return FatTreeCluster(spec)
    if spec.topology.form == "dimensions":
        return DimensionCluster(spec)
    return GraphCluster(spec)
