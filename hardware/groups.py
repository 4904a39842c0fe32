"""Process groups for a Schedule, created the same way on every rank.

``torch.distributed.new_group`` must be called by every rank, for every group, in the
same order. When the schedule was built from a Layout (``schedule.meta['layout']``),
the groups come from a ``DeviceMesh`` whose named dimensions are the layout's axes,
outermost first; any other group is created with ``new_group`` in name order.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from simulator.schedule.ir import Schedule

from .runtime import HardwareError, Runtime

__all__ = ["build_groups"]


def _axis(name: str) -> str:
    return name.rstrip("0123456789")


def build_groups(schedule: Schedule, runtime: Runtime) -> dict[str, dist.ProcessGroup]:
    """Handles of the groups this rank belongs to, by schedule group name."""
    handles: dict[str, dist.ProcessGroup] = {}
    covered: set[str] = set()
    layout = schedule.meta.get("layout")
    if layout and layout["tp"] * layout["pp"] * layout["dp"] == runtime.world:
        dims = tuple(reversed(layout["placement"]))  # DeviceMesh lists the outermost first
        mesh = init_device_mesh(
            runtime.device.type, tuple(layout[d] for d in dims), mesh_dim_names=dims
        )
        for name, members in schedule.groups.items():
            axis = _axis(name)
            if axis not in dims:
                continue
            covered.add(name)
            if runtime.rank not in members:
                continue
            group = mesh[axis].get_group()
            ranks = sorted(dist.get_process_group_ranks(group))
            if ranks != sorted(members):
                raise HardwareError(
                    f"group {name}: the device mesh gives ranks {ranks}, "
                    f"the schedule {sorted(members)}"
                )
            handles[name] = group
    for name in sorted(schedule.groups):
        if name in covered:
            continue
        ranks_of_group = sorted(schedule.groups[name])
        group = dist.new_group(ranks_of_group)
        if runtime.rank in ranks_of_group:
            handles[name] = group
    return handles
