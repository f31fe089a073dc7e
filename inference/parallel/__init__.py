"""Tensor parallelism: one engine's model split over N ranks (processes), on torch.distributed.

- `group.py`: the ranks' process groups (gloo for control, NCCL or gloo for activations) and collectives;
- `layers.py`: what each rank keeps of every weight (Megatron-style), and the vocab-parallel embedding;
- `ranks.py`: rank 0's handle on the other rank processes (start, per-step broadcast, watchdog, stop),
  and the rank processes' loop.

`EngineArgs(tensor_parallel_size=N)` is the one switch; `ModelRunner` does the rest. docs/tensor-parallel.md
tells the story.
"""
