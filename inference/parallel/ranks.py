"""The tensor-parallel rank processes: started, fed and watched by rank 0, stopped on close or on a fault.

The process that builds the engine is rank 0: it keeps the scheduler, the block manager and the sampler,
and its `ModelRunner` holds the first shard. `Ranks` starts ranks 1..N-1 as fresh interpreters running
`python -m inference.parallel.rank_process` (`RankProcess`), one per device (on CPU, N processes each with its
share of the threads). Each joins the process groups
(`group.py`), loads only its shard, allocates its `kv_heads / N` of every KV block, and loops in
`rank_main`: receive the step's batch (one broadcast from rank 0), run the forward, take part in the
all-reduces and the logits' gather. A rank runs the same runner class as rank 0 (`runner_class`, handed
in by rank 0's `ModelRunner`), so this module never imports the model runner that imports it.

Why not multiprocessing: its spawn re-imports the caller's main module in every child, so a script that
builds `LLM(..., tensor_parallel_size=N)` at its top level (vLLM's own examples do) would build it again in
each rank and die; vLLM avoids that by forking, which is unsafe once the parent has used OpenMP (a forked
child's first multi-threaded op hangs under GNU libgomp). A rank process imports only this package, so any
script works, with or without `if __name__ == "__main__":`.

Faults. A watchdog thread on rank 0 waits on every rank process; when one exits unasked it records why
(the rank's own traceback, which the rank leaves in the rendezvous store) and kills the others, which
breaks whatever collective rank 0 is in at once (gloo reports a closed peer; the device group's timeout is
the last resort). `ModelRunner.execute` then raises `RankFailedError`: the engine cannot step again, the
streaming engine fails every in-flight request and reports itself unhealthy. A rank whose rank 0 dies sees
its connections close and exits.
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

from inference.parallel.group import Group
from inference.parallel.layers import check_divisible

if TYPE_CHECKING:
    from inference.config import EngineArgs
    from inference.model import ModelConfig
    from inference.quantization import QuantizationConfig

START_TIMEOUT = datetime.timedelta(seconds=300)  # spawning, importing torch, joining the groups
STOP_TIMEOUT_S = 10.0  # a rank told to stop has this long before it is killed
FAULT_NAMING_S = 2.0  # a failed step waits this long for the watchdog to name a dead rank
WATCH_INTERVAL_S = 0.5  # how often the watchdog looks whether the engine has closed (deaths wake it at once)
REAP_TIMEOUT_S = 5.0  # how long a rank whose sentinel has closed may take to be reaped
STEP, STOP = 1, 0  # the header's kinds


class RankFailedError(RuntimeError):
    """A tensor-parallel rank died, or a step failed once its batch was sent: the ranks are out of step and
    stopped, so the engine cannot step again."""


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: the CPU for every rank, or the r-th CUDA device from the one asked for (always with
    its index: NCCL binds each rank to one)."""
    if device.type == "cpu":
        return device
    return torch.device(device.type, (device.index or 0) + rank)


def cpu_threads_per_rank(size: int) -> int:
    """torch threads for each of `size` ranks sharing this machine's CPUs: an equal share. Rank processes
    get it; rank 0 keeps the caller's own setting (set it to this for an even split)."""
    return max(1, len(os.sched_getaffinity(0)) // size)


def check_tensor_parallel(args: EngineArgs, cfg: ModelConfig, device: torch.device,
                          quant: QuantizationConfig | None) -> None:
    """Everything that would make N ranks fail, as a ValueError before any process starts."""
    size = args.tensor_parallel_size
    if cfg.mla is not None:
        raise ValueError("tensor_parallel_size>1 does not support latent attention yet (its one latent per token "
                         "is shared by all heads, so a rank's cache cannot hold a share of KV heads)")
    if cfg.moe is not None:
        raise ValueError("tensor_parallel_size>1 does not support a mixture of experts yet (its experts would be "
                         "split or placed per rank: expert parallelism is not implemented)")
    if cfg.architecture.qk_norm == "projection":
        raise ValueError("tensor_parallel_size>1 does not support a q/k norm over the whole projection (OLMo 2's) "
                         "yet: each rank holds only some heads of it")
    check_divisible(cfg, size)
    if quant is not None and quant.method in ("gguf", "awq", "gptq"):
        raise ValueError(f"tensor_parallel_size>1 does not support quantization={quant.method!r} yet "
                         "(use float weights, or 'int8' / 'int4' quantized at load)")
    if quant is not None and quant.method == "int4":
        for name, inputs in (("o_proj", cfg.num_heads // size * cfg.head_dim),
                             ("down_proj", cfg.intermediate_size // size)):
            if inputs % quant.group_size:
                raise ValueError(f"tensor_parallel_size={size} leaves {name} {inputs} inputs per rank, which "
                                 f"int4 groups of {quant.group_size} do not divide")
    if args.enable_lora:
        raise ValueError("tensor_parallel_size>1 does not support enable_lora yet")
    if device.type == "cuda":
        available = torch.cuda.device_count() - (device.index or 0)
        if size > available:
            raise ValueError(f"tensor_parallel_size={size} needs {size} CUDA devices from {device}; "
                             f"{available} are there")
    elif device.type != "cpu":
        raise ValueError(f"tensor parallelism runs on cpu (gloo) or cuda (NCCL), not {device.type!r}")


class RankRunner(Protocol):
    """What a rank process runs: a model runner built on that rank's group, fed each step's payload."""

    def __init__(self, args: EngineArgs, folder: Path, *, group: Group) -> None: ...

    def follow(self, payload: torch.Tensor) -> None:
        """Run one step rank 0 sent (its `StepBatch.to_payload()`)."""


class Ranks:
    """Rank 0's handle on ranks 1..N-1: starts them, sends each step, watches them, stops them.

    `send` and `close` are called from the engine's thread; the watchdog's thread only records a failure
    and kills processes. `failure`, once set, never changes.
    """

    def __init__(self, args: EngineArgs, folder: Path, device: torch.device,
                 runner_class: type[RankRunner]) -> None:
        size = args.tensor_parallel_size
        self.failure: str | None = None
        self._lock = threading.Lock()  # one header + payload at a time; close never cuts into a send
        self._closed = False
        self._store = dist.TCPStore("127.0.0.1", 0, size, True, timeout=START_TIMEOUT, wait_for_workers=False)
        threads = cpu_threads_per_rank(size) if device.type == "cpu" else 1
        self.processes: list[RankProcess] = []
        try:
            for rank in range(1, size):
                self.processes.append(RankProcess((rank, runner_class, args, folder, self._store.port, threads)))
            self._wait_until_joining()
            self.group = Group.join(self._store, 0, size, device)
        except BaseException as exc:
            self.abort(f"tensor-parallel start failed: {exc}")
            raise
        threading.Thread(target=self._watch, name="tensor-parallel-watchdog", daemon=True).start()
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def pids(self) -> list[int]:
        """Process ids of ranks 1..N-1, in rank order."""
        return [p.pid for p in self.processes]

    def _wait_until_joining(self) -> None:
        """Wait until every rank has started and is joining the groups (a rank that dies first is an error,
        where joining would wait for it until the store's timeout)."""
        keys = [f"joining/{rank}" for rank in range(1, len(self.processes) + 1)]
        deadline = time.monotonic() + START_TIMEOUT.total_seconds()
        while not self._store.check(keys):
            if (message := self._death()) is not None:
                raise RankFailedError(f"tensor-parallel start failed: {message}")
            if time.monotonic() > deadline:
                raise RankFailedError(f"tensor-parallel ranks did not start within {START_TIMEOUT}")
            time.sleep(0.05)

    def send(self, payload: torch.Tensor) -> None:
        """Broadcast one step's packed batch (`StepBatch.to_payload`) to every rank."""
        with self._lock:
            self.check_alive()
            if self._closed:
                raise RankFailedError("the tensor-parallel ranks have been shut down")
            self.group.broadcast(torch.tensor([STEP, payload.numel()], dtype=torch.int64))
            self.group.broadcast(payload)

    def check_alive(self) -> None:
        if self.failure is not None:
            raise RankFailedError(self.failure)

    def fail(self, error: BaseException) -> RankFailedError:
        """A step failed on rank 0 after its batch went out: stop every rank and say why, naming the rank
        that died when one did (a broken collective is usually the echo of a death)."""
        deadline = time.monotonic() + FAULT_NAMING_S
        while self.failure is None and self._death() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self._fail(self._death() or f"a step failed on rank 0: {type(error).__name__}: {error}")
        return RankFailedError(self.failure)

    def abort(self, reason: str) -> None:
        """Kill every rank now (they may be inside a collective, where a stop message would not reach them)."""
        self._fail(reason)
        self.close()

    def close(self) -> None:
        """Tell every rank to stop, wait for it, kill what is left. Idempotent; safe after a failure."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = list(self.processes)
            if self.failure is None and hasattr(self, "group") and any(p.is_alive() for p in started):
                try:
                    self.group.broadcast(torch.tensor([STOP, 0], dtype=torch.int64))
                except Exception:  # a rank already gone: the kill below ends the rest
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in started:
            process.join(max(0.0, deadline - time.monotonic()))
        _kill(started)

    # --- the watchdog ------------------------------------------------------------------------------
    def _watch(self) -> None:
        sentinels = [p.sentinel for p in self.processes]
        while not self._closed:
            if wait(sentinels, timeout=WATCH_INTERVAL_S) and not self._closed:
                self._fail(self._death(REAP_TIMEOUT_S) or "a tensor-parallel rank exited")
                return

    def _fail(self, message: str) -> None:
        """Record the first failure and kill every rank (so no collective of rank 0 waits on them)."""
        if self.failure is None:
            self.failure = message
        _kill(list(self.processes))

    def _death(self, wait_s: float = 0.0) -> str | None:
        """Why the first rank process that has exited did, or None while all run. A dead rank's exit code can
        lag its sentinel, so the watchdog looks for up to `wait_s`; the exit code is read by `waitpid`, not
        through the sentinel (in a long test run a dead rank's sentinel once never reported it)."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, process in enumerate(self.processes, start=1):
                if process.exitcode is None:
                    continue
                message = f"tensor-parallel rank {rank} (pid {process.pid}) exited with code {process.exitcode}"
                key = f"error/{rank}"
                if self._store.check([key]):
                    message += f": {self._store.get(key).decode().strip().splitlines()[-1]}"
                return message
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


def _kill(processes: list[RankProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(5)


class RankProcess:
    """One rank's interpreter, with the part of `multiprocessing.Process`'s interface `Ranks` uses.

    Its arguments travel pickled on its stdin (`runner_class` by reference); it gets the caller's `sys.path`,
    so a runner class from the caller's own modules imports there too. `sentinel` is the read end of a pipe
    only the child holds open: it turns readable when the child exits, for `multiprocessing.connection.wait`.
    """

    def __init__(self, arguments: tuple) -> None:
        sentinel, child_end = os.pipe()
        path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
        try:
            self._popen = subprocess.Popen([sys.executable, "-m", "inference.parallel.rank_process"],
                                           stdin=subprocess.PIPE, pass_fds=(child_end,),
                                           env={**os.environ, "PYTHONPATH": path})
        except BaseException:
            os.close(sentinel)
            raise
        finally:
            os.close(child_end)
        self.pid, self.sentinel = self._popen.pid, sentinel
        weakref.finalize(self, os.close, sentinel)
        try:
            self._popen.stdin.write(pickle.dumps(arguments))
            self._popen.stdin.close()
        except BrokenPipeError:  # it died at start: its exit code says so (`Ranks._death`)
            pass

    @property
    def exitcode(self) -> int | None:
        """None while it runs, else its exit status (negative: the signal that ended it)."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def _close_at_exit(ref: weakref.ref) -> None:
    ranks = ref()
    if ranks is not None:
        ranks.close()


def rank_main(rank: int, runner_class: type[RankRunner], args: EngineArgs, folder: Path, port: int,
               threads: int) -> None:
    """A rank process: join the groups, load this rank's shard, run every step rank 0 sends until STOP."""
    size = args.tensor_parallel_size
    store = dist.TCPStore("127.0.0.1", port, size, False, timeout=START_TIMEOUT)
    try:
        torch.set_num_threads(threads)
        store.set(f"joining/{rank}", "1")
        group = Group.join(store, rank, size, rank_device(args.resolve_device(), rank))
        runner = runner_class(args, folder, group=group)
        header = torch.empty(2, dtype=torch.int64)
        while group.broadcast(header)[0].item() == STEP:
            payload = group.broadcast(torch.empty(int(header[1]), dtype=torch.int64))
            runner.follow(payload)
    except BaseException:
        try:
            store.set(f"error/{rank}", traceback.format_exc())
        except Exception:  # rank 0, which holds the store, is gone
            pass
        raise SystemExit(1) from None
