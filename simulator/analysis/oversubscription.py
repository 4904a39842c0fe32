"""Which parallel axes cross a fat tree's oversubscribed links, and what that means for
the result.

A rail-optimised fat tree (:mod:`topologies.fattree`) has two places where its
bandwidth can be oversubscribed: a leaf's uplinks to its pod's spine
(``network.oversubscription``) and a pod's spine uplink to the core
(``network.core_oversubscription``). Which axes' traffic crosses them is a matter of
routes: NCCL's rings between nodes are rail-aligned and stay on one leaf, so a leaf's
uplinks only carry traffic between different rails (an all-to-all, a send between GPUs
on different rails) or between pods.

:func:`oversubscription_warnings` reads the step's process groups and sends, and says
in the result's warnings

* when an oversubscription changes nothing because no traffic crosses those links;
* when analytic fidelity is known to be optimistic: it prices each call with its
  symmetric copies in the same pipeline stage (:mod:`simulator.engine.alone`) but not
  beside other calls, so where a per-layer axis (tp, cp, ep) crosses oversubscribed
  links beside another axis, or beside its own copies in the other pipeline stages,
  their contention is only in flow fidelity.
"""

from __future__ import annotations

from collections.abc import Iterable

from simulator.engine.collectives import collective_transfers
from simulator.request.layout import Layout
from simulator.schedule.ir import Block, Schedule, Send
from topologies import Cluster

__all__ = ["crossing_axes", "oversubscription_warnings"]

#: Axes whose collectives sit inside every layer's forward and backward.
PER_LAYER_AXES = ("tp", "cp", "ep")


def _layer(cluster: Cluster, link_id: int) -> str | None:
    """``"leaf"`` for a leaf's uplink to its spine, ``"core"`` for a spine's link to the
    core, None for any other link."""
    link = cluster.links[link_id]
    if "leaf" in link.src and "spine" in link.dst:
        return "leaf"
    if link.dst == "core" or link.src == "core":
        return "core"
    return None


def _sends(schedule: Schedule) -> Iterable[tuple[int, int, str]]:
    """``(src, dst, axis)`` of every distinct send of the step."""
    seen: set[tuple[int, int]] = set()
    for rank, program in schedule.programs.items():
        for op in program.ops:
            ops = op.body if type(op) is Block else (op,)
            for inner in ops:
                if type(inner) is Send and (rank, inner.peer) not in seen:
                    seen.add((rank, inner.peer))
                    yield rank, inner.peer, inner.stream


def crossing_axes(cluster: Cluster, schedule: Schedule, layout: Layout) -> dict[str, set[str]]:
    """For ``"leaf"`` and ``"core"``: the axes whose traffic crosses those links."""
    crossing: dict[str, set[str]] = {"leaf": set(), "core": set()}
    groups = dict(schedule.groups)
    for name, images in schedule.images.items():
        for index, members in enumerate(images):
            groups[f"{name}#{index}"] = members
    for name, members in groups.items():
        if len(members) < 2:
            continue
        axis = layout.axis_of_group(name.split("#")[0])
        kind = "all_to_all" if axis == "ep" else "all_reduce"
        _, specs = collective_transfers(cluster, kind, sorted(members), 1.0)
        for spec in specs:
            for link in spec.usage:
                layer = _layer(cluster, link)
                if layer is not None:
                    crossing[layer].add(axis)
    for src, dst, stream in _sends(schedule):
        axis = "cp" if stream.startswith("cp") else "pp"
        for link in cluster.route(src, dst).links:
            layer = _layer(cluster, link)
            if layer is not None:
                crossing[layer].add(axis)
    return crossing


def oversubscription_warnings(
    cluster: Cluster, schedule: Schedule, layout: Layout, fidelity: str
) -> list[str]:
    """The warnings a step on an oversubscribed fat tree earns (none otherwise)."""
    network = getattr(cluster.spec, "network", None)
    if network is None or cluster.spec.topology is not None:
        return []
    ratios = {"leaf": network.oversubscription}
    pods = network.pod_size is not None and network.pod_size < cluster.spec.nodes
    if pods:
        ratios["core"] = network.core_oversubscription
    knobs = {"leaf": "network.oversubscription", "core": "network.core_oversubscription"}
    if network.oversubscription == 1 and network.core_oversubscription == 1:
        return []
    warnings = []
    if not pods and network.core_oversubscription != 1:
        warnings.append(
            f"cluster.network.core_oversubscription {network.core_oversubscription:g}:1 "
            "changes nothing here: the cluster is one pod (network.pod_size), so there is no "
            "core to cross"
        )
    crossing = crossing_axes(cluster, schedule, layout)
    for layer, ratio in ratios.items():
        if ratio == 1:
            continue
        axes = sorted(crossing[layer])
        if not axes:
            where = (
                "no transfer between nodes leaves its rail's leaf switch (NCCL's rings "
                "are rail-aligned)"
                if layer == "leaf"
                else "no transfer crosses between pods"
            )
            warnings.append(f"cluster.{knobs[layer]} {ratio:g}:1 changes nothing here: {where}")
            continue
        per_layer = [axis for axis in axes if axis in PER_LAYER_AXES]
        beside = [axis for axis in axes if axis not in per_layer[:1]]
        if layout.pp > 1:
            beside.append("the other pipeline stages' copies")
        if fidelity == "analytic" and per_layer and beside:
            warnings.append(
                f"analytic fidelity prices each collective with its copies in the same "
                f"pipeline stage but not beside other calls, and {per_layer[0]} traffic "
                f"crosses the {ratio:g}:1 oversubscribed {layer} links with "
                f"{', '.join(beside)}: the step is likely longer; flow fidelity "
                "(--set simulation.fidelity=flow) prices their contention"
            )
    return warnings
