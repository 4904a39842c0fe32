"""Custom topologies: a fabric described in a YAML file instead of a preset.

A scenario's ``cluster:`` block names the file (or gives the same mapping inline)
under ``topology``; everything else about the cluster comes from the file::

    cluster:
      topology: topologies/examples/switch-ring-2d.yaml   # or a mapping, inline
      nodes: 4                  # optional: checked against the file, never a resize
      gpu: {matmul_efficiency: 0.7}                       # optional overrides
      profile: profile.json                               # optional, as with presets

A relative path is looked up next to the scenario (when the caller passes its
folder), then in the working directory, then in the ``topologies/`` package (so
``examples/switch-ring-2d.yaml`` always finds the shipped examples). The
``preset``, ``nvswitch``, ``pcie``, ``nic`` and ``network`` keys do not combine with
``topology``: the file gives every link.

The file (or the inline mapping) has these top-level keys:

- ``name`` — the cluster's name (default: the file's stem, or ``custom``);
- ``gpu`` — the GPU group, as in a preset; and/or ``gpu_preset: dgx-h100`` to take
  that preset's ``gpu`` group, which ``gpu`` then overrides field by field;
- ``intra_node_link`` — ``nvlink`` (default) or ``pci``: what joins a node's GPUs,
  for NCCL's intra-node latency table; ``nvls`` — ``true`` if a node's switch
  reduces in-network (default ``false``);
- ``gpus`` — optional: the GPU count the file means, checked against the fabric;
- and one of the two forms of the fabric:

  **Per dimension** (like ASTRA-sim's network files), innermost first::

      dimensions:
        - {kind: switch, size: 4, bandwidth: 450 GB/s, latency: 0.6 us}
        - {kind: ring,   size: 4, bandwidth: 50 GB/s,  latency: 1 us}

  ``kind`` is ``switch`` or ``ring``; ``bandwidth`` is per direction of each GPU's
  link into the switch, or of each ring hop; ``latency`` is GPU to GPU through the
  switch, or per ring hop. There are ``prod(size)`` GPUs and the innermost
  dimension is a node (``gpus_per_node``, if given, must equal its ``size``).
  Routes: :mod:`topologies.dimensions`.

  **Explicit graph**::

      gpus_per_node: 2
      devices:
        - {name: gpu0, kind: gpu}          # kind: gpu | switch | nic
        - {name: sw0, kind: switch}
      links:
        - {a: gpu0, b: sw0, bandwidth: 64 GB/s, latency: 0.5 us}   # bidirectional: true

  GPUs are numbered in the order listed; ``gpus_per_node`` (required) groups them
  into nodes. Each link is two directed edges unless ``bidirectional: false``.
  Routes: least latency, :mod:`topologies.graph`.

Every problem is one :class:`~topologies.errors.TopologyError` line naming the field
and the numbers: an unknown key (with the nearest valid key), a zero or negative
bandwidth (naming the link), a duplicate device name, a link to an unknown device,
sizes that do not multiply to the GPU count, a GPU with no route to another (naming
both GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .config_text import ConfigTextError, read_yaml
from .errors import TopologyError
from .files import LARGEST_TOPOLOGY, ConfigFileError, read_config_text
from .spec import DeviceSpec, DimensionSpec, GraphLinkSpec, TopologySpec, check_topology
from .validation import shown, unknown_key_hint, validation_message

__all__ = ["TOPOLOGY_KEYS", "CustomTopology", "find_topology_file", "read_topology"]

PACKAGE_DIR = Path(__file__).parent

TOPOLOGY_KEYS = [
    "name",
    "gpu",
    "gpu_preset",
    "gpus_per_node",
    "gpus",
    "intra_node_link",
    "nvls",
    "dimensions",
    "devices",
    "links",
]
"""The keys a topology file may have."""


@dataclass(frozen=True)
class CustomTopology:
    """A topology file read and checked: the cluster fields it stands for."""

    name: str
    gpus_per_node: int
    nodes: int
    gpu: dict[str, Any]
    """The file's ``gpu`` group as written (human units); may be partial or empty."""
    gpu_preset: str | None
    """The preset whose ``gpu`` group the file borrows, if any."""
    topology: TopologySpec


def find_topology_file(source: str | Path, base_dir: str | Path | None = None) -> Path | None:
    """The file ``source`` names: as given if absolute, else next to ``base_dir``, in the
    working directory, or in the ``topologies/`` package, first found; None if none."""
    path = Path(source)
    if path.is_absolute():
        return path if path.is_file() else None
    folders = [Path(base_dir)] if base_dir is not None else []
    for folder in [*folders, Path.cwd(), PACKAGE_DIR]:
        if (folder / path).is_file():
            return folder / path
    return None


def _read_yaml(source: str | Path, prefix: str, base_dir: str | Path | None) -> tuple[Any, Path]:
    path = find_topology_file(source, base_dir)
    if path is None:
        where = ", ".join(
            str(p) for p in ([Path(base_dir)] if base_dir is not None else []) + [Path.cwd()]
        )
        raise TopologyError(
            f"{prefix}: cannot find topology file {shown(str(source))} (looked in {where} "
            f"and {PACKAGE_DIR})"
        )
    try:
        return read_yaml(read_config_text(path, LARGEST_TOPOLOGY), prefix, path.name), path
    except ConfigFileError as exc:
        raise TopologyError(f"{prefix}: cannot read {path} ({exc.reason})") from None
    except ConfigTextError as exc:
        raise TopologyError(str(exc)) from None


def _items(
    raw: dict[str, Any], key: str, model: type[BaseModel], prefix: str
) -> tuple[Any, ...] | None:
    """Validate each entry of list ``raw[key]`` as ``model``, naming the entry on error."""
    if key not in raw:
        return None
    entries = raw[key]
    if not isinstance(entries, list):
        raise TopologyError(f"{prefix}.{key}: expected a list (got {type(entries).__name__})")
    items = []
    for i, entry in enumerate(entries):
        where = f"{prefix}.{key}[{i}]"
        if not isinstance(entry, dict):
            raise TopologyError(f"{where}: expected a mapping (got {shown(entry)})")
        try:
            items.append(model.model_validate(entry))
        except ValidationError as exc:
            message = validation_message(exc, model, where)
            if model is GraphLinkSpec:
                ends = (shown(str(entry.get(end)), 40)[1:-1] for end in ("a", "b"))
                message += " on link {} <-> {}".format(*ends)
            raise TopologyError(message) from None
    return tuple(items)


def _whole(raw: dict[str, Any], key: str, prefix: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(f"{prefix}.{key}: must be a whole number >= 1 (got {shown(value)})")
    return value


def read_topology(
    source: str | Path | dict[str, Any],
    prefix: str = "cluster.topology",
    base_dir: str | Path | None = None,
) -> CustomTopology:
    """Read a topology file (or an inline mapping) and check it; see the module docstring."""
    path: Path | None = None
    if isinstance(source, dict):
        raw: Any = source
    elif isinstance(source, (str, Path)):
        raw, path = _read_yaml(source, prefix, base_dir)
    else:
        raise TopologyError(
            f"{prefix}: expected the path of a topology file or a mapping (got {shown(source)})"
        )
    if not isinstance(raw, dict):
        raise TopologyError(f"{prefix}: expected a mapping at the top of {path or 'topology'}")
    for key in raw:
        if key not in TOPOLOGY_KEYS:
            hint = unknown_key_hint(str(key), TOPOLOGY_KEYS)
            raise TopologyError(
                f"{prefix}.{key}: unknown key{hint}; valid keys: {', '.join(TOPOLOGY_KEYS)}"
            )
    fabric = {
        "dimensions": _items(raw, "dimensions", DimensionSpec, prefix),
        "devices": _items(raw, "devices", DeviceSpec, prefix),
        "links": _items(raw, "links", GraphLinkSpec, prefix),
    }
    options = {k: raw[k] for k in ("intra_node_link", "nvls") if k in raw}
    try:
        topology = TopologySpec.model_validate(
            {**fabric, **options, "source": str(path) if path else ""}
        )
    except ValidationError as exc:
        raise TopologyError(validation_message(exc, TopologySpec, prefix)) from None

    per_node, declared = _whole(raw, "gpus_per_node", prefix), _whole(raw, "gpus", prefix)
    if topology.dimensions is not None and topology.dimensions:
        first = topology.dimensions[0].size
        if per_node is not None and per_node != first:
            raise TopologyError(
                f"{prefix}.gpus_per_node: gpus_per_node({per_node}) != dimensions[0].size"
                f"({first}); the innermost dimension is the node"
            )
        per_node = first
        if declared is not None and declared != topology.num_gpus:
            sizes = " x ".join(str(d.size) for d in topology.dimensions)
            raise TopologyError(
                f"{prefix}.dimensions: sizes {sizes} = {topology.num_gpus} GPUs, but "
                f"gpus is {declared}"
            )
    elif topology.devices is not None and topology.dimensions is None:
        if per_node is None:
            raise TopologyError(
                f"{prefix}.gpus_per_node: required field is missing (an explicit graph says "
                f"how many of its GPUs, in the order listed, form a node)"
            )
        count = topology.num_gpus
        if declared is not None and declared != count:
            raise TopologyError(
                f"{prefix}.devices: {count} devices of kind gpu, but gpus is {declared}"
            )
        if count == 0:
            raise TopologyError(f"{prefix}.devices: no device of kind gpu")
        if count % per_node:
            raise TopologyError(
                f"{prefix}.gpus_per_node: gpus_per_node({per_node}) must divide the {count} "
                f"devices of kind gpu"
            )
    per_node = per_node or 1
    nodes = max(1, topology.num_gpus // per_node)
    check_topology(topology, per_node, nodes, prefix)
    gpu = raw.get("gpu") or {}
    if not isinstance(gpu, dict):
        raise TopologyError(f"{prefix}.gpu: expected a mapping of GPU fields (got {shown(gpu)})")
    preset = raw.get("gpu_preset")
    if preset is not None and not isinstance(preset, str):
        raise TopologyError(f"{prefix}.gpu_preset: expected a preset name (got {shown(preset)})")
    name = raw.get("name", path.stem if path else "custom")
    return CustomTopology(str(name), per_node, nodes, gpu, preset, topology)
