"""Execute one rank's Program of a Schedule with torch.distributed, and time every op.

* ``Compute`` ops run real torch work: ``torch.mm`` of the op's GEMM shape when it has
  one (``torch.bmm`` for a batched GEMM), causal ``scaled_dot_product_attention`` at
  the attention kernel's shape; otherwise, whichever the roofline says dominates, a
  GEMM of the op's FLOPs or a copy that moves the op's bytes.
* ``Collective`` ops map to ``all_reduce``, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``, ``all_to_all_single`` (uneven ``splits`` too),
  ``broadcast`` and ``barrier`` on the op's group; ``Send``/``Recv`` go through
  ``batch_isend_irecv``.
* Streams. On CUDA each IR stream is a ``torch.cuda.Stream``; ops are enqueued in
  program order, a cross-stream dep becomes ``wait_event``, and CUDA events around each
  op time it, so overlap really happens. On CPU the compute stream runs on the calling
  thread while communication runs as async work (gloo's own threads); a stream issues
  its next op when the previous one completed, and completion times come from the work
  futures' callbacks.
* Verification: on request, every collective and receive is filled with a
  rank-dependent pattern and its result is checked against the expected values.

Times are seconds from the step's start (after a barrier); ``ready`` is when the op
was issued, ``start`` when it began on its stream, ``end`` when it finished.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from simulator.schedule.ir import Collective, Compute, Recv, Schedule, Send
from simulator.traces.labels import call_label, compute_label

from .compat import all_gather_single, reduce_scatter_single
from .p2p import issuable
from .runtime import HardwareError, Runtime, Watchdog, inject_fault

__all__ = ["StepTimes", "ComputeKernels", "ProgramExecutor", "clean_backend_error", "make_buffers"]


def clean_backend_error(exc: BaseException) -> str:
    """The useful part of a gloo/NCCL error: no source location, no advice paragraph."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". This is typically")[0]


@dataclass
class StepTimes:
    """Each op's ready, start and end time in seconds from the step's origin, and the
    origin itself on this rank's ``time.perf_counter`` clock (the moment the step's
    opening barrier let this rank go)."""

    ready: list[float]
    start: list[float]
    end: list[float]
    origin: float = 0.0


def _on_completion(work, callback: Callable[[BaseException | None], None]) -> None:
    """Call ``callback`` when ``work`` completes, with the error it failed with (None
    when it succeeded): through its future where the backend has one, otherwise from a
    thread that waits for it (gloo's send/recv)."""

    def wait() -> None:
        try:
            work.wait()
        except Exception as exc:  # a timeout or a lost peer: the caller reports it
            callback(exc)
        else:
            callback(None)

    try:
        future = work.get_future()
    except RuntimeError:
        threading.Thread(target=wait, daemon=True).start()
        return

    def done(fut) -> None:
        try:
            fut.value()
        except Exception as exc:
            callback(exc)
        else:
            callback(None)

    future.add_done_callback(done)


class _Buffers:
    """Tensors reused across ops and steps, keyed by (role, stream, numel): matrices in
    the compute dtype, and vectors (communication, copies) in fp32, whose integers are
    exact to 2^24, so a check of a sum over any group the replay runs is exact (a bf16
    ring over 72 ranks rounds 2,628 to 2,624)."""

    #: The vectors' dtype and its size in bytes.
    VECTOR_DTYPE = torch.float32
    VECTOR_BYTES = 4

    def __init__(self, device: torch.device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        self._cache: dict[tuple, torch.Tensor] = {}

    def get(self, role: str, stream: str, numel: int) -> torch.Tensor:
        key = (role, stream, numel)
        tensor = self._cache.get(key)
        if tensor is None:
            tensor = torch.ones(max(1, numel), device=self.device, dtype=self.VECTOR_DTYPE)
            self._cache[key] = tensor
        return tensor

    def matrix(self, role: str, rows: int, cols: int, batch: int = 0) -> torch.Tensor:
        """A ``rows × cols`` matrix (``batch`` of them when ``batch`` is not 0)."""
        key = (role, rows, cols, batch)
        tensor = self._cache.get(key)
        if tensor is None:
            shape = (batch, rows, cols) if batch else (rows, cols)
            tensor = torch.randn(*shape, device=self.device, dtype=self.dtype) * 0.01
            self._cache[key] = tensor
        return tensor


def make_buffers(device: torch.device) -> tuple[_Buffers, int]:
    """The tensors of a rank's ops (matrices in bf16 on a GPU, fp32 on a CPU; vectors in
    fp32) and the vectors' element size in bytes, which turns an op's bytes into
    elements."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return _Buffers(device, dtype), _Buffers.VECTOR_BYTES


class ComputeKernels:
    """The kernels that stand for Compute ops on a device, shared by the replay and by
    the calibration that times the same ops: a GEMM or batched GEMM of the op's shape
    (buffers reused by shape, as a training step reuses its workspaces), attention as
    causal ``scaled_dot_product_attention``, and an op without a shape as a GEMM of its
    FLOPs or a copy of its bytes, whichever the roofline says dominates."""

    def __init__(self, buffers: _Buffers, element: int, peak_flops: float, memory_bandwidth: float):
        self.buffers = buffers
        self.element = element
        self.peak_flops = peak_flops
        self.memory_bandwidth = memory_bandwidth

    def run(self, op: Compute) -> None:
        if op.kind == "attention" and op.shape is not None:
            self._attention(op)
            return
        if op.shape is not None and op.batch > 1:
            m, n, k = op.shape
            a = self.buffers.matrix("a", m, k, op.batch)
            b = self.buffers.matrix("b", k, n, op.batch)
            torch.bmm(a, b, out=self.buffers.matrix("c", m, n, op.batch))
            return
        if op.shape is not None:
            m, n, k = op.shape
            a = self.buffers.matrix("a", m, k)
            b = self.buffers.matrix("b", k, n)
            out = self.buffers.matrix("c", m, n)
            torch.mm(a, b, out=out)
            return
        compute_s = op.flops / self.peak_flops
        memory_s = op.bytes / self.memory_bandwidth
        if compute_s >= memory_s and op.flops > 0:
            side = max(1, int(round((op.flops / 2) ** (1 / 3))))
            a = self.buffers.matrix("a", side, side)
            torch.mm(a, a, out=self.buffers.matrix("c", side, side))
        elif op.bytes > 0:
            numel = max(1, int(round(op.bytes / 2 / self.element)))  # read once, write once
            self.buffers.get("dst", "compute", numel).copy_(
                self.buffers.get("src", "compute", numel)
            )

    def _attention(self, op: Compute) -> None:
        """Causal ``scaled_dot_product_attention`` at the op's shape (``batch`` sequences
        × heads of ``s × d``), as many times as the op's FLOPs hold forwards (the
        backward recomputes the scores: about 2.5 forwards)."""
        assert op.shape is not None  # the attention core always has one
        s_q, s_kv, d = op.shape
        q = self.buffers.matrix("q", s_q, d, op.batch).unsqueeze(0)
        kv = self.buffers.matrix("k", s_kv, d, op.batch).unsqueeze(0)
        forward_flops = 4.0 * op.batch * s_q * s_kv * d
        for _ in range(max(1, math.floor(op.flops / forward_flops + 0.5))):
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True)


class ProgramExecutor:
    """Runs ``schedule.programs[rank]`` on this rank, one step at a time."""

    def __init__(
        self,
        schedule: Schedule,
        runtime: Runtime,
        groups: dict[str, dist.ProcessGroup],
        peak_flops: float,
        memory_bandwidth: float,
        labelled: bool = False,
    ):
        self.runtime = runtime
        # under a profiler: each op's range named for what it is (simulator.traces.labels)
        self.labelled = labelled
        self.rank = runtime.rank
        self.program = schedule.programs[runtime.rank]
        self.ops = self.program.ops
        self.schedule = schedule
        self.groups = groups
        self.peak_flops = peak_flops
        self.memory_bandwidth = memory_bandwidth
        self.buffers, self.element = make_buffers(runtime.device)
        self.kernels = ComputeKernels(self.buffers, self.element, peak_flops, memory_bandwidth)
        self.group_members = {name: tuple(sorted(m)) for name, m in schedule.groups.items()}
        for op in self.ops:
            for dep in op.deps:
                if not 0 <= dep < op.id:
                    raise HardwareError(
                        f"schedule: rank {self.rank} op {op.id} depends on op {dep}, which "
                        "does not come before it in the program"
                    )
        self._recv_splits = self._all_to_all_receive_splits()
        # NCCL: pipeline sends and receives go out as matched batches (hardware.p2p)
        self._p2p_batches = issuable(schedule, self.rank) if runtime.is_cuda else {}
        self.current = -1

    # -- tensors ----------------------------------------------------------------------
    def _numel(self, size: float) -> int:
        return max(1, int(round(size / self.element)))

    def _all_to_all_receive_splits(self) -> dict[int, list[int]]:
        """For each uneven all-to-all of this rank: element counts it receives per peer."""
        per_group: dict[str, list] = {}
        for rank, program in self.schedule.programs.items():
            for op in program.ops:
                if type(op) is Collective and op.kind == "all_to_all":
                    per_group.setdefault(op.group, []).append((rank, op))
        received: dict[int, list[int]] = {}
        for op in self.ops:
            if type(op) is not Collective or op.kind != "all_to_all" or op.splits is None:
                continue
            members = self.group_members[op.group]
            me = members.index(self.rank)
            index = sum(
                1 for o in self.ops[: op.id] if type(o) is Collective and o.group == op.group
            )
            counts = []
            for peer in members:
                peer_ops = [
                    o
                    for o in self.schedule.programs[peer].ops
                    if type(o) is Collective and o.group == op.group
                ]
                peer_op = peer_ops[index]
                counts.append(self._numel(peer_op.splits[me]) if peer_op.splits else 0)
            received[op.id] = counts
        return received

    # -- profiler ranges ----------------------------------------------------------------
    def _range(self, op) -> Any:
        """A profiler range naming ``op`` (a compute op, or a call where it is issued),
        or nothing when the executor is not labelled."""
        if not self.labelled:
            return contextlib.nullcontext()
        if type(op) is Compute:
            name = compute_label(op.kind, op.flops, op.bytes, op.shape, op.batch, op.fp8)
        elif type(op) is Collective:
            members = self.group_members[op.group]
            name = call_label(op.id, op.kind, op.group, members, op.bytes)
        else:
            src, dst = (self.rank, op.peer) if type(op) is Send else (op.peer, self.rank)
            name = call_label(op.id, "p2p", f"{src}>{dst}:{op.tag}", (src, dst), op.bytes)
        return torch.profiler.record_function(name)

    # -- communication ------------------------------------------------------------------
    def _issue_comm(self, op, verify: bool) -> tuple[list, Callable[[], None]]:
        """Start ``op`` asynchronously; returns its works and a check to run at the end."""
        if type(op) in (Send, Recv):
            p2p, check = self._p2p(op, verify)
            if self.runtime.backend == "nccl":
                works = dist.batch_isend_irecv([p2p])
            else:  # gloo: batch_isend_irecv coalesces across the group; plain isend/irecv
                works = [p2p.op(p2p.tensor, p2p.peer, tag=p2p.tag)]
            return works, check
        group = self.groups[op.group]
        members = self.group_members[op.group]
        n = len(members)
        kind = op.kind
        numel = self._numel(op.bytes)
        if kind in ("all_gather", "reduce_scatter", "all_to_all") and op.splits is None:
            numel = max(n, numel - numel % n)
        value = float(self.rank + 1)
        if kind == "all_reduce":
            tensor = self.buffers.get("ar", op.stream, numel)
            if verify:
                tensor.fill_(value)
            work = dist.all_reduce(tensor, group=group, async_op=True)
            total = float(sum(m + 1 for m in members))
            return [work], lambda: self._expect(op, bool((tensor == total).all()))
        if kind == "all_gather":
            out = self.buffers.get("ag_out", op.stream, numel)
            inp = self.buffers.get("ag_in", op.stream, numel // n)
            if verify:
                inp.fill_(value)
            work = all_gather_single(out, inp, group=group, async_op=True)
            want = torch.repeat_interleave(
                torch.tensor([m + 1.0 for m in members], dtype=out.dtype, device=out.device),
                numel // n,
            )
            return [work], lambda: self._expect(op, bool(torch.equal(out, want)))
        if kind == "reduce_scatter":
            inp = self.buffers.get("rs_in", op.stream, numel)
            out = self.buffers.get("rs_out", op.stream, numel // n)
            if verify:
                inp.fill_(value)
            work = reduce_scatter_single(out, inp, group=group, async_op=True)
            total = float(sum(m + 1 for m in members))
            return [work], lambda: self._expect(op, bool((out == total).all()))
        if kind == "all_to_all":
            if op.splits is None:
                inp = self.buffers.get("a2a_in", op.stream, numel)
                out = self.buffers.get("a2a_out", op.stream, numel)
                send_counts = recv_counts = [numel // n] * n
                in_splits = out_splits = None
            else:
                send_counts = [self._numel(s) if s > 0 else 0 for s in op.splits]
                recv_counts = self._recv_splits[op.id]
                inp = self.buffers.get("a2a_in", op.stream, sum(send_counts))[: sum(send_counts)]
                out = self.buffers.get("a2a_out", op.stream, sum(recv_counts))[: sum(recv_counts)]
                in_splits, out_splits = send_counts, recv_counts
            if verify:
                inp.fill_(value)
            work = dist.all_to_all_single(
                out, inp, out_splits, in_splits, group=group, async_op=True
            )
            want = torch.repeat_interleave(
                torch.tensor([m + 1.0 for m in members], dtype=out.dtype, device=out.device),
                torch.tensor(recv_counts, device=out.device),
            )
            return [work], lambda: self._expect(op, bool(torch.equal(out, want)))
        if kind == "broadcast":
            tensor = self.buffers.get("bc", op.stream, numel)
            if verify:
                tensor.fill_(value)
            root = members[0]
            work = dist.broadcast(tensor, src=root, group=group, async_op=True)
            return [work], lambda: self._expect(op, bool((tensor == root + 1.0).all()))
        if kind == "barrier":
            return [dist.barrier(group=group, async_op=True)], lambda: None
        raise HardwareError(f"rank {self.rank} op {op.id}: unknown collective kind {kind!r}")

    def _p2p(self, op: Send | Recv, verify: bool) -> tuple[dist.P2POp, Callable[[], None]]:
        """The send or receive as a ``P2POp``, and the check of what a receive got."""
        tensor = self.buffers.get("p2p", op.stream, self._numel(op.bytes))
        if verify:
            tensor.fill_(self.rank + 1 if type(op) is Send else -1)
        fn = dist.isend if type(op) is Send else dist.irecv
        expected = op.peer + 1

        def check() -> None:
            if type(op) is Recv and not bool((tensor == expected).all()):
                raise HardwareError(f"rank {self.rank} op {op.id} {op.label}: received wrong data")

        return dist.P2POp(fn, tensor, op.peer, tag=op.tag), check

    def _expect(self, op, ok: bool) -> None:
        if not ok:
            raise HardwareError(
                f"rank {self.rank} op {op.id} {op.label or op.kind} on {op.group}: wrong result"
            )

    def _comm_failure(self, op, error: BaseException) -> HardwareError:
        """The error of a communication that did not complete: a timeout says that a
        peer stopped responding, with the timeout; anything else, what the backend said."""
        text = clean_backend_error(error)
        if "timed out" in text.lower() or "timeout" in text.lower():
            return HardwareError(
                f"{self.describe_current()}: no answer from the other ranks of {op.group} "
                f"within the {self.runtime.timeout_s:g} s timeout (a peer stopped responding)"
            )
        return HardwareError(f"{self.describe_current()}: {text}")

    def describe_current(self) -> str:
        if 0 <= self.current < len(self.ops):
            op = self.ops[self.current]
            return f"at op {op.id} {op.label or type(op).__name__} ({op.stream})"
        return ""

    # -- one step -----------------------------------------------------------------------
    def run_step(self, verify: bool = False, watchdog: Watchdog | None = None) -> StepTimes:
        try:
            if self.runtime.is_cuda:
                return self._run_step_cuda(verify, watchdog)
            return self._run_step_cpu(verify, watchdog)
        except RuntimeError as exc:  # a torch.distributed failure: say where it happened
            raise HardwareError(f"{self.describe_current()}: {clean_backend_error(exc)}") from None

    def _run_step_cpu(self, verify: bool, watchdog: Watchdog | None) -> StepTimes:
        ops = self.ops
        n = len(ops)
        ready, start, end = [math.nan] * n, [math.nan] * n, [math.nan] * n
        finished = [False] * n
        pending = [0] * n  # works of each op whose completion has not been seen yet
        streams: dict[str, list] = {}
        for op in ops:
            streams.setdefault(op.stream, []).append(op)
        heads = {name: 0 for name in streams}
        inflight: dict[str, tuple] = {}
        wake = threading.Event()
        lock = threading.Lock()
        remaining = n
        dist.barrier()
        t0 = time.perf_counter()

        failed: dict[int, BaseException] = {}

        def completed(op_id: int):
            def callback(error: BaseException | None) -> None:
                with lock:
                    if error is not None:
                        failed.setdefault(op_id, error)
                    pending[op_id] -= 1
                    if pending[op_id] == 0:
                        end[op_id] = time.perf_counter() - t0
                wake.set()

            return callback

        while remaining:
            progressed = False
            # retire communication whose works have all completed
            for name, (op, check) in list(inflight.items()):
                if pending[op.id]:
                    continue
                if op.id in failed:  # the communication itself failed: never a wrong result
                    self.current = op.id
                    raise self._comm_failure(op, failed[op.id])
                if verify:
                    check()  # before the stream's next op reuses the buffer
                finished[op.id] = True
                remaining -= 1
                del inflight[name]
                heads[name] += 1
                progressed = True
                if watchdog is not None:
                    watchdog.progress()
            # issue communication whose stream is free and whose deps are done
            for name, queue in streams.items():
                if name in inflight or heads[name] >= len(queue):
                    continue
                op = queue[heads[name]]
                if type(op) is Compute or not all(finished[d] for d in op.deps):
                    continue
                self.current = op.id
                inject_fault(self.rank, op.id)
                ready[op.id] = start[op.id] = time.perf_counter() - t0
                with self._range(op):
                    works, check = self._issue_comm(op, verify)
                pending[op.id] = len(works)
                inflight[name] = (op, check)
                for work in works:
                    _on_completion(work, completed(op.id))
                progressed = True
            # run the next compute op of any stream if its deps are done
            for name, queue in streams.items():
                if heads[name] >= len(queue):
                    continue
                op = queue[heads[name]]
                if type(op) is not Compute or not all(finished[d] for d in op.deps):
                    continue
                self.current = op.id
                inject_fault(self.rank, op.id)
                ready[op.id] = start[op.id] = time.perf_counter() - t0
                with self._range(op):
                    self.kernels.run(op)
                end[op.id] = time.perf_counter() - t0
                finished[op.id] = True
                remaining -= 1
                heads[name] += 1
                progressed = True
                if watchdog is not None:
                    watchdog.progress()
                break  # give communication a chance to be issued first
            if not progressed:
                wake.wait(0.001)
                wake.clear()
        return StepTimes(ready, start, end, origin=t0)

    def _issue_batch(self, batch, streams, begin_events, end_events, done_events, verify) -> None:
        """Sends and receives of a matched batch as one NCCL group call on the stream of
        its first op, after every member's dependencies (:mod:`hardware.p2p`)."""
        members = [self.ops[i] for i in batch]
        stream = streams[members[0].stream]
        for op in members:
            for dep in op.deps:
                stream.wait_event(done_events[dep])
        with torch.cuda.stream(stream):
            for op in members:
                begin_events[op.id].record(stream)
            calls = [self._p2p(op, verify) for op in members]
            with contextlib.ExitStack() as ranges:
                for op in members:
                    ranges.enter_context(self._range(op))
                works = dist.batch_isend_irecv([p2p for p2p, _ in calls])
            for work in works:
                work.wait()  # makes this stream wait for the transfers
            if verify:
                stream.synchronize()
                for _, check in calls:
                    check()
            for op in members:
                end_events[op.id].record(stream)
                done_events[op.id].record(stream)

    def _run_step_cuda(self, verify: bool, watchdog: Watchdog | None) -> StepTimes:
        ops = self.ops
        device = self.runtime.device
        streams = {name: torch.cuda.Stream(device=device) for name in self.program.streams()}
        done_events = [torch.cuda.Event() for _ in ops]
        begin_events = [torch.cuda.Event(enable_timing=True) for _ in ops]
        end_events = [torch.cuda.Event(enable_timing=True) for _ in ops]
        dist.barrier()
        torch.cuda.synchronize(device)
        host_origin = time.perf_counter()  # the GPU is idle: its origin event runs now
        origin = torch.cuda.Event(enable_timing=True)
        origin.record(torch.cuda.current_stream(device))
        for stream in streams.values():
            stream.wait_event(origin)
        for op in ops:
            self.current = op.id
            inject_fault(self.rank, op.id)
            if type(op) in (Send, Recv):
                batch = self._p2p_batches.get(op.id)
                if batch is not None:  # else it is issued with its batch, later
                    self._issue_batch(batch, streams, begin_events, end_events, done_events, verify)
                if watchdog is not None:
                    watchdog.progress()
                continue
            stream = streams[op.stream]
            for dep in op.deps:
                stream.wait_event(done_events[dep])
            with torch.cuda.stream(stream):
                begin_events[op.id].record(stream)
                if type(op) is Compute:
                    with self._range(op):
                        self.kernels.run(op)
                else:
                    with self._range(op):
                        works, check = self._issue_comm(op, verify)
                    for w in works:
                        w.wait()  # makes this stream wait for the communication
                    if verify:
                        stream.synchronize()
                        check()
                end_events[op.id].record(stream)
                done_events[op.id].record(stream)
            if watchdog is not None:
                watchdog.progress()
        torch.cuda.synchronize(device)
        start = [origin.elapsed_time(e) / 1e3 for e in begin_events]
        end = [origin.elapsed_time(e) / 1e3 for e in end_events]
        return StepTimes(list(start), start, end, origin=host_origin)
