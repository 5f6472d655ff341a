"""MultiProcExecutor: tensor parallelism with one process per rank (NCCL on GPUs, gloo on the CPU).

Rank 0's ModelRunner lives in the engine process; ranks 1..N-1 are spawned workers. Each step
rank 0 pickles an ``ExecuteStep`` message (the scheduler output: a delta against every rank's persistent
batch) into a shared-memory block (``tp_worker.py``), signals each worker (which acknowledges once it has
read it, so rank 0 may write the next one), and all ranks run the step in lockstep; rank 0 then samples
(steps that qualify for ``minivllm.sample.sharded`` sample every rank's vocabulary slice). A monitor
thread watches the workers' sentinels: if one dies, the others are
killed, an NCCL group is aborted, and the engine raises a clear RuntimeError.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import uuid
from contextlib import suppress
from multiprocessing.connection import wait as wait_any
from multiprocessing.shared_memory import SharedMemory

import torch

from minivllm.config import Config
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.worker.cpu_threads import set_cpu_threads
from minivllm.worker.model_runner import ModelRunner, device_for_rank
from minivllm.worker.outputs import SampledTokens
from minivllm.worker.step_handle import Forward, StepHandle
from minivllm.worker.tp_worker import (
    HEADER,
    ExecuteStep,
    Shutdown,
    WorkerMessage,
    dump_stacks_if_stalled,
    free_port,
    new_group,
    shm_size,
    worker_main,
)

_START_TIMEOUT_S = 300.0  # spawn + imports of a worker
_EXIT_TIMEOUT_S = 10.0  # graceful exit before terminate, then kill
#: the exit code of a worker that started an engine while importing the user's script (no __main__ guard)
EXIT_NO_MAIN_GUARD = 78
NO_MAIN_GUARD = ("the script that builds the engine runs again in every tensor-parallel worker process (they "
                 "start with the spawn method, which imports it), so build the engine under "
                 "`if __name__ == \"__main__\":`")


def _exit_if_importing_main() -> None:
    """In a spawned worker that is still importing the user's script (which builds an engine at import time):
    say why and exit with ``EXIT_NO_MAIN_GUARD``, instead of multiprocessing's bootstrapping error."""
    if getattr(mp.current_process(), "_inheriting", False):
        print(f"minivllm: {NO_MAIN_GUARD}", file=sys.stderr, flush=True)
        os._exit(EXIT_NO_MAIN_GUARD)


class MultiProcExecutor:
    """Tensor parallel size > 1: rank 0 here, ranks 1..N-1 in spawned worker processes.

    An ``Executor``: ``start_step`` / ``finish_step``, ``num_kvcache_blocks`` and an idempotent ``close()``.
    """

    def __init__(self, config: Config):
        _exit_if_importing_main()
        self.config = config
        self.runner = None
        self.group = None  # rank 0's TPGroup
        dump_stacks_if_stalled(config.envs.hang_dump_s)
        self.procs: list = []
        self._failure: str | None = None
        self._failed = threading.Event()
        self._closing = self._closed = False
        self._monitor_thread = None
        ctx = mp.get_context("spawn")
        self.shm = SharedMemory(name=f"mvllm_tp_{os.getpid()}_{uuid.uuid4().hex[:12]}", create=True,
                                size=shm_size(config))
        self.init_method = f"tcp://127.0.0.1:{free_port()}"
        self._wake_r, self._wake_w = ctx.Pipe(duplex=False)
        # NOTE: one semaphore per worker as its "event", not mp.Event: an mp.Event hides a lock,
        # and a worker killed while holding it would block rank 0's next set() forever.
        self.signals = [ctx.Semaphore(0) for _ in range(1, config.parallel_config.tensor_parallel_size)]
        self.acks = [ctx.Semaphore(0) for _ in self.signals]
        self._unacked = False  # a command was written that some worker may not have read yet
        readies = [ctx.Semaphore(0) for _ in self.signals]
        try:
            for rank, (sig, ack, ready) in enumerate(zip(self.signals, self.acks, readies), 1):
                p = ctx.Process(target=worker_main, name=f"minivllm-tp{rank}", daemon=True,
                                args=(config, rank, self.init_method, self.shm.name, sig, ack, ready,
                                      os.getpid()))
                p.start()
                self.procs.append(p)
            self._monitor_thread = threading.Thread(target=self._monitor, name="minivllm-tp-monitor", daemon=True)
            self._monitor_thread.start()
            deadline = time.monotonic() + _START_TIMEOUT_S
            for rank, ready in enumerate(readies, 1):
                while not ready.acquire(timeout=0.1):
                    if self._failure or time.monotonic() > deadline:
                        raise RuntimeError(self._failure or f"tensor-parallel worker rank {rank} did not start")
            device = device_for_rank(config, 0)
            if device.type == "cuda":
                torch.cuda.set_device(device)
            set_cpu_threads(config)
            self.group = new_group(config, device, 0, self.init_method, stop=self._failed.is_set)
            self.runner = ModelRunner(config, 0, self.group)
            self._raise_if_failed()
        except BaseException as exc:
            err = self._dead_worker_error(exc)
            self.close()
            if err is not None and str(err) != str(exc):
                raise err from exc
            raise
        self.num_kvcache_blocks = self.runner.num_kvcache_blocks
        self.kv_cache_groups = self.runner.kv_cache_groups

    # ------------------------------------------------------------------ steps
    def start_step(self, out: SchedulerOutput) -> Forward:
        """Queue one step's forward on every rank; ``finish_step`` samples it (rank 0), and the workers' share of
        the step (a sharded sampling, the broadcast of the tokens) waits on the device until then.

        Raises RuntimeError (here or from the handle's ``result()``) if a worker died.
        """
        self._raise_if_failed()
        if self.runner is None:
            raise RuntimeError("the tensor-parallel executor is closed")
        # NOTE: every rank takes the same path (eager or CUDA graph, logits or not, gathered or sharded
        # sampling) because it depends only on this output and the batch it updates, the same on every rank,
        # so the collectives match across ranks
        self._send(ExecuteStep(_for_workers(out)))
        return self._guard(self.runner.start_step, out)

    def finish_step(self, forward: Forward, grammar=None) -> _TPStepHandle:
        """Sample a started step on rank 0 (with its grammar masks); returns its handle."""
        return _TPStepHandle(self, self._guard(self.runner.finish_step, forward, grammar))

    def _guard(self, fn, *args):
        """``fn(*args)`` on rank 0, turning a dead worker or a failed collective into a clear error."""
        try:
            result = fn(*args)
        except BaseException as exc:
            err = self._dead_worker_error(exc)
            if err is not None:
                raise err from exc
            # NOTE: the workers may be waiting in a collective that rank 0 left: later steps
            # would pair mismatched collectives (garbage or a hang), so the engine stops here.
            self._fail(f"a tensor-parallel step failed on rank 0 ({type(exc).__name__}: {exc}); "
                       "the ranks are out of step and the engine cannot continue")
            raise
        self._raise_if_failed()  # an aborted NCCL step may "finish" with garbage
        return result

    def _wait_acks(self, timeout: float | None = None) -> None:
        """Wait until every worker has read the last command (raises if one died meanwhile)."""
        if not self._unacked:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        for rank, ack in enumerate(self.acks, 1):
            while not ack.acquire(timeout=0.1):
                self._raise_if_failed()
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel worker rank {rank} did not read its command")
        self._unacked = False

    def _send(self, msg: WorkerMessage, timeout: float | None = None) -> None:
        """Write ``msg`` for every worker and wake them (after they have read the previous one)."""
        self._wait_acks(timeout)
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        end = HEADER.size + len(data)
        if end > self.shm.size:
            raise RuntimeError(f"a step of {len(data)} bytes exceeds the {self.shm.size}-byte shared memory")
        self.shm.buf[HEADER.size:end] = data
        HEADER.pack_into(self.shm.buf, 0, len(data))
        self._unacked = True
        for sig in self.signals:
            sig.release()

    # ---------------------------------------------------------------- failures
    def _monitor(self) -> None:
        """Thread: wait for a worker to exit; unless closing, record why, kill the rest, abort NCCL."""
        by_sentinel = {p.sentinel: rank for rank, p in enumerate(self.procs, 1)}
        ready = wait_any([*by_sentinel, self._wake_r])
        dead = [self.procs[by_sentinel[s] - 1] for s in ready if s in by_sentinel]
        if self._closing or not dead:
            return
        for p in dead:
            p.join(1.0)
        # peers of a dead rank may fail and exit with it; blame a signal-killed one first
        proc = min(dead, key=lambda p: (p.exitcode is None or p.exitcode >= 0, self.procs.index(p)))
        rank = self.procs.index(proc) + 1
        if proc.exitcode == EXIT_NO_MAIN_GUARD:
            return self._fail(f"tensor-parallel worker rank {rank} could not start: {NO_MAIN_GUARD}")
        self._fail(f"tensor-parallel worker rank {rank} died (exit code {proc.exitcode}); the engine cannot continue")

    def _fail(self, message: str) -> None:
        """Record the first failure, kill the workers left, abort an NCCL group (pending collectives return)."""
        if self._failure is None:
            self._failure = message
        self._failed.set()
        self._kill_workers()
        if self.group is not None:
            self.group.abort()

    def _dead_worker_error(self, exc: BaseException) -> RuntimeError | None:
        """The RuntimeError to raise for ``exc`` if a worker died (gives the monitor a moment to see it)."""
        if self._failed.wait(5.0 if isinstance(exc, RuntimeError) else 0.0):
            return RuntimeError(self._failure)
        return None

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RuntimeError(self._failure)

    def _kill_workers(self) -> None:
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
        for p in self.procs:
            p.join(5.0)

    # --------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop the workers (exit command, then terminate / kill), leave the group, free the shared memory."""
        if self._closed:
            return
        self._closed = self._closing = True
        if self.runner is not None:
            self.runner.release_graphs()  # NOTE: a monitor aborting NCCL waits for this (see release_graphs)
        self._wake_w.close()  # ends the monitor's wait; it sees _closing and returns
        if self._monitor_thread is not None:
            self._monitor_thread.join(15.0)  # so the monitor cannot report the exits below
        if self._failure is None and any(p.exitcode is None for p in self.procs):
            with suppress(ValueError, BufferError, RuntimeError):
                self._send(Shutdown(), timeout=_EXIT_TIMEOUT_S)
        deadline = time.monotonic() + _EXIT_TIMEOUT_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.exitcode is None:
                p.terminate()
                p.join(2.0)
            if p.exitcode is None:
                p.kill()
                p.join(2.0)
        if self.runner is not None:
            self.runner.release_graphs()
            self.runner = None
        if self.group is not None:
            self.group.shutdown()
            self.group = None
        self._wake_r.close()
        self.acks = []
        self.signals = []  # drops the named semaphores (/dev/shm/sem.mp-*) with the last reference
        self.shm.close()
        with suppress(FileNotFoundError):
            self.shm.unlink()


def _for_workers(out: SchedulerOutput) -> SchedulerOutput:
    """``out`` without the token values that only rank 0 reads (penalties' statistics, the proposer's history)."""
    if not any(r.prompt_token_ids or r.output_token_ids or r.all_token_ids for r in out.new_requests):
        return out
    return out._replace(new_requests=tuple(r._replace(prompt_token_ids=None, output_token_ids=None,
                                                      all_token_ids=None) for r in out.new_requests))


class _TPStepHandle:
    """Rank 0's step handle, with the executor's dead-worker checks around ``result()``."""

    def __init__(self, executor: MultiProcExecutor, handle: StepHandle):
        self.executor, self.handle = executor, handle

    def result(self) -> SampledTokens:
        return self.executor._guard(self.handle.result)
