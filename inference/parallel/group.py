"""The collectives tensor parallelism needs, over torch.distributed process groups joining the ranks.

Two groups join the same ranks (as in vLLM):

- `control`, always gloo on CPU tensors: each step's batch metadata from rank 0, and the start-up
  agreement on the pool size. It never times out: a worker waits in it for the next step for as long as
  the engine stays idle.
- `device`, NCCL on CUDA and gloo on CPU: the all-reduces of the row-parallel layers and the vocab-parallel
  embedding, and the gather of the logits to rank 0. It times out after `COLLECTIVE_TIMEOUT`, so no rank
  waits forever on one that hangs (a rank that dies is noticed at once, see `ranks.py`).

Both are c10d backend objects made for one engine (`ProcessGroupGloo`, `ProcessGroupNCCL`), not torch's
process-wide default group: a process may hold several engines (the tests do), and none may claim the one
default group. A `Group` of size 1 is the single-device engine: every collective is a no-op.
"""

from __future__ import annotations

import datetime
import time
from collections import defaultdict

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
# gloo has no "never"; ten years is one. Idle workers wait in the control group this long.
IDLE_TIMEOUT = datetime.timedelta(days=3650)


class Group:
    """This process' rank among `size` tensor-parallel ranks, and the collectives they run together.

    `seconds` adds up the wall time this rank spent in each kind of collective (waiting for the slowest
    rank included): the benchmark's communication figure.
    """

    def __init__(self, rank: int, size: int, control: dist.ProcessGroup | None = None,
                 device: dist.ProcessGroup | None = None) -> None:
        self.rank, self.size = rank, size
        self._control, self._device = control, device
        self.seconds: dict[str, float] = defaultdict(float)

    @classmethod
    def single(cls) -> Group:
        return cls(0, 1)

    @classmethod
    def join(cls, store: dist.Store, rank: int, size: int, device: torch.device) -> Group:
        """Join both groups through `store` (every rank calls this; it returns once all have)."""
        control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, size, IDLE_TIMEOUT)
        if device.type == "cuda":
            torch.cuda.set_device(device)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = COLLECTIVE_TIMEOUT
            device_group = dist.ProcessGroupNCCL(dist.PrefixStore("device", store), rank, size, options)
        else:
            device_group = dist.ProcessGroupGloo(dist.PrefixStore("device", store), rank, size, COLLECTIVE_TIMEOUT)
        return cls(rank, size, control, device_group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it."""
        if self.size > 1:
            start = time.perf_counter()
            self._device.allreduce([x]).wait()
            self.seconds["all_reduce"] += time.perf_counter() - start
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every rank's `x` side by side (`[rows, size * cols]`, rank order) on rank 0; None on the others."""
        if self.size == 1:
            return x
        start = time.perf_counter()
        x = x.contiguous()
        options = dist.GatherOptions()
        options.rootRank = 0
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else []
        self._device.gather([parts] if self.rank == 0 else [], [x], options).wait()
        self.seconds["gather"] += time.perf_counter() - start
        return torch.cat(parts, dim=-1) if self.rank == 0 else None

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's CPU tensor `x` into every rank's `x` (same shape and dtype), over the control group."""
        start = time.perf_counter()
        self._control.broadcast(x, 0).wait()
        self.seconds["broadcast"] += time.perf_counter() - start
        return x

    def min(self, value: int) -> int:
        """The smallest of every rank's `value` (the ranks agree on one number)."""
        if self.size == 1:
            return value
        x = torch.tensor([value], dtype=torch.int64)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        self._control.allreduce([x], options).wait()
        return int(x.item())
