"""Sweeps on a Dask cluster (:mod:`simulator.tools.scheduler`): the same ranking as the
process pool, and no candidate lost when a worker dies mid-sweep."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal

import pytest

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

from simulator.common.errors import ParasimError  # noqa: E402
from simulator.tools.scheduler import SCHEDULER_ENV, open_dask, scheduler_address  # noqa: E402
from simulator.tools.sweep import run_sweep  # noqa: E402

from .conftest import SCENARIOS  # noqa: E402

pytestmark = pytest.mark.slow  # a cluster takes seconds to start

FIXED = {"tp": 2}


def _ranking(result) -> str:
    return json.dumps(result.to_json(), sort_keys=True)


@pytest.fixture(scope="module")
def pool_result():
    return run_sweep(SCENARIOS / "small.yaml", fixed=dict(FIXED), workers=2)


def test_a_local_cluster_ranks_exactly_as_the_process_pool(pool_result):
    on_dask = run_sweep(SCENARIOS / "small.yaml", fixed=dict(FIXED), workers=2, scheduler="local")
    assert _ranking(on_dask) == _ranking(pool_result)


class _KillAWorker:
    """A progress sink that kills one Dask worker process as the first simulated chunk
    comes back, while the rest are still queued or running."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.killed: list[int] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def stage(self, description: str, total: int):
        def advance(n: int) -> None:
            if description.startswith("simulating") and not self.killed:
                os.kill(self.pids[0], signal.SIGKILL)
                self.killed.append(self.pids[0])

        return advance


def test_a_killed_worker_loses_no_candidate(pool_result):
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = sorted(client.run(os.getpid).values())
        sink = _KillAWorker(pids)
        result = run_sweep(
            SCENARIOS / "small.yaml",
            fixed=dict(FIXED),
            workers=2,
            scheduler=cluster.scheduler_address,
            progress=sink,
        )
    assert sink.killed  # a worker did die during the simulations
    assert result.counts == pool_result.counts
    assert _ranking(result) == _ranking(pool_result)


def test_the_scheduler_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    assert scheduler_address(None) is None
    assert scheduler_address("local") == "local"
    monkeypatch.setenv(SCHEDULER_ENV, "tcp://10.0.0.1:8786")
    assert scheduler_address(None) == "tcp://10.0.0.1:8786"
    assert scheduler_address("local") == "local"  # the flag wins
    with pytest.raises(ParasimError, match="--scheduler: expected 'local' or a scheduler"):
        scheduler_address("host:8786")


def test_an_unreachable_scheduler_is_one_line(capsys, tmp_path):
    from simulator.cli.main import main

    argv = ["sweep", str(SCENARIOS / "small.yaml"), "--fix", "tp=2", "--no-cache"]
    assert main([*argv, "--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("parasim: error: --scheduler: cannot reach")


@pytest.mark.parametrize(
    "address,expected",
    [
        ("inproc://x", "reaches a scheduler inside this process only"),
        ("inproc://127.0.0.1/1/2", "reaches a scheduler inside this process only"),
        ("foo://host:8786", "unknown scheme 'foo'"),
        ("tcp://", "expected tcp://HOST:PORT"),
        ("tcp://host", "expected tcp://HOST:PORT"),
        ("tcp://host:port", "expected tcp://HOST:PORT"),
        ("tcp://host:0", "expected tcp://HOST:PORT"),
        ("tcp://host:65536", "expected tcp://HOST:PORT"),
        ("host:8786", "expected 'local' or a scheduler"),
    ],
)
def test_an_odd_scheduler_address_is_one_line_before_anything_starts(address, expected, tmp_path):
    from simulator.cli.main import main

    err = io.StringIO()
    argv = ["sweep", str(SCENARIOS / "small.yaml"), "--scheduler", address]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parasim: error: --scheduler")
    assert expected in lines[0]
    for good in ("tcp://10.0.0.1:8786", "tls://[::1]:8786", "ucx://host:13337", "local"):
        assert scheduler_address(good) == good


def test_a_local_cluster_that_fails_to_start_is_one_line(monkeypatch):
    """A worker killed while the local cluster starts: Dask raises from its nanny."""
    import distributed

    def dying(*args, **kwargs):
        raise RuntimeError("Nanny failed to start.\nmore of Dask's own story")

    monkeypatch.setattr(distributed, "LocalCluster", dying)
    with pytest.raises(ParasimError) as caught:
        open_dask("local", 2)
    message = str(caught.value)
    assert message == (
        "--scheduler local: the local Dask cluster of 2 workers did not start (Nanny failed "
        "to start.); run again, or without --scheduler"
    )
