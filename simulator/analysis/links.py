"""Link utilisation over a simulated step (flow fidelity).

The flow network records, for every link it used, each instant its carried rate
changed. :func:`link_summary` turns that into per-link figures — bytes carried, mean
and peak utilisation — and :func:`utilisation_bins` into a fixed grid of time bins
(mean utilisation per bin) that a heatmap can draw.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from topologies import Cluster, Link

__all__ = ["busiest", "carried_bytes", "link_summary", "link_name", "utilisation_bins"]


def _carried(series: list[tuple[float, float]], end: float) -> float:
    """Bytes a link carried: the integral of its rate over ``[0, end]``."""
    total = 0.0
    for (t0, rate), (t1, _) in zip(series, [*series[1:], (end, 0.0)], strict=True):
        total += rate * max(0.0, min(t1, end) - t0)
    return total


# carried_bytes of the last series map (by identity, kept alive here, one only: a flow
# network's is large): the result's link summary and the report's heatmap both rank
# every link by what it carried, one after the other
_CARRIED: list[tuple[Any, float, dict[int, float]]] = []


@runtime_checkable
class _Arrays(Protocol):
    """Series that sum themselves (:class:`~simulator.engine.network.LinkSeries`)."""

    def carried(self, end: float) -> dict[int, float]: ...

    def peak(self, link: int) -> float: ...


def carried_bytes(
    utilisation: Mapping[int, list[tuple[float, float]]], step_time: float
) -> dict[int, float]:
    """Bytes each link carried over ``[0, step_time]`` (:func:`_carried`), remembered
    for the same ``utilisation`` object and step."""
    for known, step, carried in _CARRIED:
        if known is utilisation and step == step_time:
            return carried
    if isinstance(utilisation, _Arrays):
        carried = utilisation.carried(step_time)
    else:
        carried = {link: _carried(series, step_time) for link, series in utilisation.items()}
    _CARRIED.append((utilisation, step_time, carried))
    del _CARRIED[:-1]
    return carried


def link_summary(
    cluster: Cluster,
    utilisation: Mapping[int, list[tuple[float, float]]],
    step_time: float,
    top: int = 20,
) -> list[dict[str, Any]]:
    """The ``top`` busiest links (by bytes carried), busiest first."""
    rows = []
    by_link = carried_bytes(utilisation, step_time)
    for link_id in busiest(by_link, top, lambda link: link_name(cluster.links[link], "->")):
        link = cluster.links[link_id]
        carried = by_link[link_id]
        rows.append(
            {
                "link": f"{link.src}->{link.dst}",
                "bandwidth_Bps": link.bandwidth,
                "bytes": carried,
                "mean_utilisation": carried / (link.bandwidth * step_time)
                if step_time > 0
                else 0.0,
                "peak_utilisation": _peak(utilisation, link_id) / link.bandwidth,
            }
        )
    return rows


def _peak(utilisation: Mapping[int, list[tuple[float, float]]], link: int) -> float:
    if isinstance(utilisation, _Arrays):
        return utilisation.peak(link)
    return max(rate for _, rate in utilisation[link])


def link_name(link: Link, arrow: str) -> str:
    """``src{arrow}dst``."""
    return f"{link.src}{arrow}{link.dst}"


def busiest(carried: Mapping[int, float], top: int, name: Callable[[int], str]) -> list[int]:
    """The ``top`` links that carried the most bytes (any), busiest first, links that
    carried as much in the order of their ``name``: named are only the links that
    carried at least the ``top``-th most, so a cluster's many idle links cost nothing."""
    links = np.fromiter(carried.keys(), np.int64, len(carried))
    amounts = np.fromiter(carried.values(), float, len(carried))
    moving = amounts > 0
    links, amounts = links[moving], amounts[moving]
    if not len(links):
        return []
    # amounts equal to ten digits are ties, broken by name: symmetric links' sums of
    # the same crossings differ only in rounding
    least = float(f"{np.sort(amounts)[::-1][min(top, len(amounts)) - 1]:.10g}")
    candidates = links[amounts >= least * (1 - 1e-9)].tolist()
    ranked = sorted(candidates, key=lambda link: (-float(f"{carried[link]:.10g}"), name(link)))
    return ranked[:top]


def utilisation_bins(
    series: list[tuple[float, float]], bandwidth: float, step_time: float, bins: int = 200
) -> list[float]:
    """Mean utilisation (0..1) of one link in each of ``bins`` equal slices of the step:
    the carried bytes (the integral of the piecewise-constant rate) between the slices'
    edges, over what the link could carry in a slice."""
    width = step_time / bins
    if width <= 0 or not series:
        return [0.0] * bins
    # (instant, rate) rows; fromiter over the flattened pairs is several times faster
    # than np.array on a list of tuples
    flat = itertools.chain.from_iterable(series)
    points = np.fromiter(flat, dtype=float, count=2 * len(series)).reshape(-1, 2)
    times = np.clip(np.append(points[:, 0], step_time), 0.0, step_time)
    rates = np.maximum(0.0, points[:, 1])
    carried = np.concatenate([[0.0], np.cumsum(rates * np.diff(times))])
    edges = np.minimum(np.arange(bins + 1) * width, step_time)
    return (np.diff(np.interp(edges, times, carried)) / (bandwidth * width)).tolist()
