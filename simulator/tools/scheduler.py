"""Where a search's candidates run: this machine's cores, or a Dask cluster.

``parasim sweep`` checks and simulates its candidates in chunks through a
``concurrent.futures`` executor (:func:`simulator.tools.sweep.run_chunked`). By default
that is a process pool on this machine's cores. With ``--scheduler`` (or the
``PARASIM_DASK_SCHEDULER`` environment variable) it is a Dask ``distributed`` cluster
instead, reached through its futures interface:

* ``tcp://HOST:8786``: an existing scheduler, whose workers have parasim installed
  (``dask scheduler`` and ``dask worker tcp://HOST:8786 --nthreads 1`` by hand, or a
  ``dask_jobqueue.SLURMCluster`` on a SLURM cluster: ``docs/guide.md``);
* ``local``: a ``LocalCluster`` of ``--workers`` single-threaded worker processes on
  this machine, started for the search and closed after it.

Dask does the rest: a chunk whose worker is lost is run again on another (up to the
scheduler's ``allowed-failures``), so no candidate is lost; Ctrl-C cancels the chunks
not yet run. What Dask cannot recover from is one line, never a traceback: an address
of another scheme (``inproc://`` reaches a scheduler inside this very process only, so
it is refused), one without a port, a scheduler that cannot be reached, a local
cluster whose worker dies while it starts. ``distributed`` is an optional dependency (``pip install
"parasim[cluster]"``), imported only here and only when a scheduler is named; the
simulator core never imports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from simulator.common.errors import ParasimError

__all__ = ["SCHEDULER_ENV", "SCHEMES", "DaskExecutor", "scheduler_address", "open_dask"]

#: The environment variable that names a scheduler when ``--scheduler`` does not.
SCHEDULER_ENV = "PARASIM_DASK_SCHEDULER"

#: Dask settings of a ``LocalCluster``'s workers: no statistical profiler and no GIL
#: monitor, and the event loop's watchdog tick (20 ms), the system monitor (0.5 s,
#: the dashboard's CPU and memory plots) and the nannies' memory check (0.1 s) at a
#: slower pace: on a two-core machine they ran beside the workers and took
#: about a tenth of a core from them (the sweep's own process, which holds the
#: scheduler and the nannies, spent 0.59-0.79 s of CPU on 500 layouts with Dask's
#: defaults against 0.21-0.24 s with these, ``benchmarks/RESULTS.md``). Workers
#: started by hand take such settings from the environment
#: (``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False``, ``docs/guide.md``).
QUIET_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.gil.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
}


#: The schemes of a scheduler's address that reach another process (Dask's comms;
#: ``inproc`` reaches a scheduler inside this process only).
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


def scheduler_address(given: str | None) -> str | None:
    """``--scheduler``, else ``$PARASIM_DASK_SCHEDULER``, else None (the process pool):
    ``local``, or ``SCHEME://HOST:PORT`` with a scheme of :data:`SCHEMES`."""
    address = given if given is not None else os.environ.get(SCHEDULER_ENV) or None
    if address is None or address == "local":
        return address
    scheme, separator, place = address.partition("://")
    if not separator:
        raise ParasimError(
            f"--scheduler: expected 'local' or a scheduler address such as "
            f"tcp://host:8786 (got {address!r})"
        )
    if scheme == "inproc":
        raise ParasimError(
            f"--scheduler {address!r}: an inproc:// address reaches a scheduler inside this "
            "process only, which has none; give a running scheduler's tcp://host:8786, "
            "or 'local'"
        )
    if scheme not in SCHEMES:
        raise ParasimError(
            f"--scheduler {address!r}: unknown scheme {scheme!r}; expected "
            f"{', '.join(s + '://' for s in SCHEMES)} or 'local'"
        )
    host, colon, port = place.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ParasimError(
            f"--scheduler {address!r}: expected {scheme}://HOST:PORT with a port from 1 "
            "to 65535, e.g. tcp://host:8786"
        )
    return address


class DaskExecutor(Executor):
    """A ``concurrent.futures`` executor on a Dask cluster: ``submit`` returns a
    ``concurrent.futures.Future``, and ``shutdown`` cancels what has not run and
    closes the client (and the local cluster it started, if any)."""

    def __init__(self, client: Any, cluster: Any = None):
        self.client = client
        self.cluster = cluster
        # pure=False: two chunks with equal arguments are still two tasks
        self.executor = client.get_executor(pure=False)
        #: how many tasks the cluster runs at once (its workers' threads)
        self.threads = max(1, sum(client.nthreads().values()))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return self.executor.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        try:
            self.executor.shutdown(wait=wait and not cancel_futures)
        finally:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_dask(address: str, workers: int) -> DaskExecutor:
    """Connect to the scheduler at ``address``, or start a ``LocalCluster`` of
    ``workers`` processes for ``local``; a missing ``distributed``, an unreachable
    scheduler or a local cluster that fails to start (a worker killed as it starts)
    is one line. Dask's own error logs are silenced while the cluster starts: what
    went wrong is that line."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ParasimError(
            "--scheduler: Dask's distributed is not installed (pip install 'parasim[cluster]')"
        ) from None
    if address == "local":
        import dask

        cluster = None
        try:
            # the workers' statistical profiler samples their stacks every 10 ms, and the
            # GIL monitor every 1 ms: for pure-Python tasks both take the GIL from the work
            with dask.config.set(QUIET_WORKERS):
                cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    host="127.0.0.1",
                    silence_logs=logging.CRITICAL,
                )
            return DaskExecutor(Client(cluster), cluster)
        except Exception as exc:  # Dask raises what its nannies and comms met
            if cluster is not None:
                with contextlib.suppress(Exception):  # what closing it meets too
                    cluster.close()
            raise ParasimError(
                f"--scheduler local: the local Dask cluster of {workers} workers did not "
                f"start ({_first_line(exc)}); run again, or without --scheduler"
            ) from None
    try:
        return DaskExecutor(Client(address, timeout="10s"))
    except Exception as exc:  # unreachable, refused, timed out, not a scheduler
        raise ParasimError(f"--scheduler: cannot reach {address} ({_first_line(exc)})") from None
