"""From a scenario's ``cluster:`` block to a built :class:`~topologies.cluster.Cluster`.

A scenario names a preset and the number of nodes, and may override any preset field
by giving the same nesting::

    cluster:
      preset: dgx-a100
      nodes: 16
      gpu: {matmul_efficiency: 0.6}
      nic: {bandwidth: "100 Gb/s"}

:func:`load_cluster_spec` reads the preset YAML from ``topologies/presets/``,
deep-merges the overrides into it (mappings merge key by key, anything else
replaces) and validates the result as a :class:`~topologies.spec.ClusterSpec`.
Without ``preset`` the block must give every field itself. Any problem becomes one
:class:`~topologies.errors.TopologyError` line such as
``cluster.gpu.matmul_effciency: unknown key (did you mean 'matmul_efficiency'?)``.
:func:`build_cluster` then turns the spec into the network graph.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .cluster import Cluster
from .errors import TopologyError
from .profile import load_profile, profile_overrides
from .spec import ClusterSpec, check_cluster_spec
from .validation import nearest_key_hint, validation_message

__all__ = ["preset_names", "load_preset", "load_cluster_spec", "build_cluster"]

PRESET_DIR = Path(__file__).parent / "presets"


def preset_names() -> list[str]:
    """Names of the shipped cluster presets, sorted (``['dgx-a100', 'dgx-h100']``)."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """The raw mapping of preset ``name`` as written in its YAML file (human units)."""
    names = preset_names()
    if name not in names:
        hint = nearest_key_hint(str(name), names)
        raise TopologyError(f"unknown preset {name!r}{hint}; presets: {', '.join(names)}")
    with open(PRESET_DIR / f"{name}.yaml", encoding="utf-8") as f:
        data = yaml.safe_load(f)
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


def load_cluster_spec(config: Mapping[str, Any], prefix: str = "cluster") -> ClusterSpec:
    """Validate a scenario's ``cluster:`` mapping (preset + nodes + overrides)."""
    if not isinstance(config, Mapping):
        raise TopologyError(
            f"{prefix}: expected a mapping such as {{preset: dgx-a100, nodes: 2}} (got {config!r})"
        )
    valid = ["preset", "profile", *ClusterSpec.model_fields]
    for key in config:
        if key not in valid:
            hint = nearest_key_hint(str(key), valid)
            raise TopologyError(
                f"{prefix}.{key}: unknown key{hint}; valid keys: {', '.join(sorted(valid))}"
            )
    overrides = {k: v for k, v in config.items() if k not in ("preset", "profile")}
    base: dict[str, Any] = {}
    if "preset" in config:
        try:
            base = load_preset(config["preset"])
        except TopologyError as exc:
            raise TopologyError(f"{prefix}.preset: {exc}") from None
    if config.get("profile") is not None:
        source = str(config["profile"])
        profile = load_profile(source, f"{prefix}.profile")
        per_node = overrides.get("gpus_per_node", base.get("gpus_per_node"))
        base = _deep_merge(base, profile_overrides(profile, per_node, source, f"{prefix}.profile"))
    try:
        spec = ClusterSpec.model_validate(_deep_merge(base, overrides))
    except ValidationError as exc:
        raise TopologyError(validation_message(exc, ClusterSpec, prefix)) from None
    check_cluster_spec(spec, prefix)
    return spec


def build_cluster(spec: ClusterSpec) -> Cluster:
    """The network graph and routing of ``spec``."""
    return Cluster(spec)
