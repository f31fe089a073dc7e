"""Suite-wide settings: tests run offline, on the CPU, with a fixed number of threads."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Test processes (pytest, and the servers and workers it starts) share two cores: one OpenMP thread each
# avoids the oversubscription that made small torch ops up to 100x slower when several spin at once.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# No GPU here or in CI: Triton kernels run under Triton's interpreter on CPU tensors. It must be set
# before triton is first imported, by any test module.
os.environ.setdefault("TRITON_INTERPRET", "1")
