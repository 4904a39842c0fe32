"""Link utilisation over a simulated step (flow fidelity).

The flow network records, for every link it used, each instant its carried rate
changed. :func:`link_summary` turns that into per-link figures — bytes carried, mean
and peak utilisation — and :func:`utilisation_bins` into a fixed grid of time bins
(mean utilisation per bin) that a heatmap can draw.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from topologies import Cluster

__all__ = ["carried_bytes", "link_summary", "utilisation_bins"]


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


def carried_bytes(
    utilisation: Mapping[int, list[tuple[float, float]]], step_time: float
) -> dict[int, float]:
    """Bytes each link carried over ``[0, step_time]`` (:func:`_carried`), remembered
    for the same ``utilisation`` object and step."""
    for known, step, carried in _CARRIED:
        if known is utilisation and step == step_time:
            return carried
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
    for link_id, series in utilisation.items():
        link = cluster.links[link_id]
        carried = by_link[link_id]
        if carried <= 0:
            continue
        rows.append(
            {
                "link": f"{link.src}->{link.dst}",
                "bandwidth_Bps": link.bandwidth,
                "bytes": carried,
                "mean_utilisation": carried / (link.bandwidth * step_time)
                if step_time > 0
                else 0.0,
                "peak_utilisation": max(rate for _, rate in series) / link.bandwidth,
            }
        )
    rows.sort(key=lambda row: (-row["bytes"], row["link"]))
    return rows[:top]


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
