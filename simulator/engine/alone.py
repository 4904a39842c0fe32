"""Communication times alone on the network: analytic fidelity's cost of each call.

A collective or send/recv whose transfers have the network to themselves takes its
plan's latency plus the time its busiest link needs for the bytes crossing it. The
closed-form solver, the SimPy engine in analytic fidelity and block bodies all time
communication this way; :class:`AloneTimes` memoises it per group, kind and size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simulator.engine.collectives import TransferSpec, collective_transfers, p2p_transfer
from simulator.schedule.ir import Collective
from topologies import Cluster

__all__ = ["AloneTimes", "time_alone"]


def time_alone(cluster: Cluster, specs: Sequence[TransferSpec], latency: float) -> float:
    """Seconds for ``specs``, started together with nothing else on the network: the
    latest latency plus the busiest link's bytes over its bandwidth (``latency`` when
    there is nothing to move)."""
    if not specs:
        return latency
    load: dict[int, float] = {}
    for spec in specs:
        if spec.volume <= 0:
            continue
        for link, mult in spec.usage.items():
            load[link] = load.get(link, 0.0) + spec.volume * mult
    links = cluster.links
    busiest = max((volume / links[link].bandwidth for link, volume in load.items()), default=0.0)
    return max(spec.latency for spec in specs) + busiest


class AloneTimes:
    """Times of collectives and send/recv pairs alone on ``cluster`` (memoised).

    ``groups`` maps group names to member GPUs; ``algorithm``/``protocol`` pin NCCL's
    choice (None: NCCL's own)."""

    def __init__(
        self,
        cluster: Cluster,
        groups: Mapping[str, Sequence[int]],
        algorithm: str | None = None,
        protocol: str | None = None,
    ):
        self.cluster = cluster
        self.group_gpus = {name: sorted(members) for name, members in groups.items()}
        self.algorithm = algorithm
        self.protocol = protocol
        self._memo: dict[tuple, object] = {}

    def collective(self, op: Collective, splits=None) -> tuple[float, str]:
        """``(seconds, "kind/algorithm/protocol")`` of ``op`` (``splits``: an uneven
        all-to-all's bytes per member and peer, not memoised)."""
        key = (op.group, op.kind, op.bytes)
        cached = None if splits is not None else self._memo.get(key)
        if cached is None:
            choice, specs = collective_transfers(
                self.cluster,
                op.kind,
                self.group_gpus[op.group],
                op.bytes,
                splits,
                self.algorithm,
                self.protocol,
            )
            cached = (
                time_alone(self.cluster, specs, choice.latency),
                f"{op.kind}/{choice.algorithm}/{choice.protocol}",
            )
            if splits is None:
                self._memo[key] = cached
        return cached

    def p2p(self, src: int, dst: int, size: float) -> float:
        """Seconds of a send/recv of ``size`` bytes from GPU ``src`` to ``dst``."""
        key = ("p2p", src, dst, size)
        cached = self._memo.get(key)
        if cached is None:
            spec = p2p_transfer(self.cluster, src, dst, size, self.protocol)
            cached = self._memo[key] = time_alone(self.cluster, [spec], spec.latency)
        return cached
