"""The benchmarks, kept outside the engine (`inference` never imports them). `python -m bench`: our engine against
its peers on the same seeded workloads, in one run; `bench.kernels`, `bench.serving` and `bench.gpu_suite` measure
the kernels, the web path and a GPU; `bench.render` turns the records in `bench/results/` into BENCHMARKS.md.

Every figure that matters is a ratio measured in a single run, because these machines are shared and noisy.
Modules, one job each:
- `textgen`      real-ish user messages from a seeded generator (no downloads)
- `workloads`    the seeded workloads (chat, shared-prefix, parallel, beam, long), arrival times, JSONL I/O
- `stats`        percentiles and per-engine figures from per-request token times
- `kv`           KV-cache accounting: bytes per token, reservation vs live tokens over time, fixed-budget capacity
- `engines/`     one adapter per engine (ours, HF static, HF continuous batching, llama.cpp)
- `roofline`     measured matmul FLOP/s and the fraction our decode steps reach
- `experiments`  prefix caching on/off, n=4 sharing, beam sharing, fixed budget, concurrency sweep
- `report`       text tables, ratios and target verdicts
- `plots`        PNG figures (matplotlib, Agg)
- `kernels`      the attention kernels timed alone (Triton, the torch reference, contiguous SDPA)
- `serving/`     tokens through websockets and the streaming API against the bare engine (embedded stack)
- `gpu_suite`    the prepared GPU run: kernel tests, bandwidth, the HF oracle, throughput
- `render`       BENCHMARKS.md and README's headline from `bench/results/*.json`
"""
