"""PNG figures for `--plot DIR` (matplotlib, Agg backend: no display needed).

- throughput_vs_concurrency.png: decode tokens/s per batch size, ours vs HF generate (from the roofline runs)
- kv_memory_over_time.png: paged (ours) vs contiguous (HF static), stacked live / wasted KV memory
- ttft_cdf.png: time-to-first-token distribution per engine on the chat workload
- prefix_caching.png: prompt tokens computed and TTFT p50 with prefix caching on vs off
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from bench.engines.base import EngineRun  # noqa: E402

MIB = 1024**2


def write_all(out_dir: Path, result: dict[str, Any], runs: dict[str, EngineRun], bytes_per_token: int) -> list[Path]:
    """Write every figure the result has data for; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if result.get("roofline"):
        written.append(throughput_vs_concurrency(out_dir / "throughput_vs_concurrency.png", result["roofline"]))
    paged, contiguous = runs.get("ours"), runs.get("hf_static")
    if paged and contiguous:
        written.append(kv_memory_over_time(out_dir / "kv_memory_over_time.png", paged, contiguous, bytes_per_token))
    written.append(ttft_cdf(out_dir / "ttft_cdf.png", runs))
    if "prefix_caching" in result:
        written.append(prefix_caching(out_dir / "prefix_caching.png", result["prefix_caching"]))
    return written


def throughput_vs_concurrency(path: Path, roofline: dict[str, Any]) -> Path:
    rows = roofline["decode"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["batch"] for r in rows], [r["ours_tokens_per_s"] for r in rows], "o-", label="ours (paged)")
    if all("hf_tokens_per_s" in r for r in rows):
        ax.plot([r["batch"] for r in rows], [r["hf_tokens_per_s"] for r in rows], "s--", label="HF generate")
    ax.set(xlabel="concurrent sequences (decode batch)", ylabel="decode tokens/s",
           title="Decode throughput vs concurrency")
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    ax.set_xticks([r["batch"] for r in rows], [str(r["batch"]) for r in rows])
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def kv_memory_over_time(path: Path, paged: EngineRun, contiguous: EngineRun, bytes_per_token: int) -> Path:
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharey=True)
    for ax, run, title in ((axes[0], paged, "paged (ours)"), (axes[1], contiguous, "contiguous (HF static)")):
        points = run.kv.relative_to(run.start) + [(run.kv.end - run.start, 0, 0)]
        t = [p[0] for p in points]
        live = [p[2] * bytes_per_token / MIB for p in points]
        waste = [(p[1] - p[2]) * bytes_per_token / MIB for p in points]
        ax.stackplot(t, live, waste, labels=["holding live tokens", "reserved, wasted"], step="post",
                     colors=["#3b7dd8", "#e8a33d"])
        ax.set(title=title, ylabel="KV memory (MiB)")
        ax.legend(loc="upper right")
    axes[1].set_xlabel("seconds since the run started")
    fig.suptitle("KV memory over time, chat workload")
    return _save(fig, path)


def ttft_cdf(path: Path, runs: dict[str, EngineRun]) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        ttfts = sorted(t.ttft for t in run.timings)
        ax.step(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post", label=name)
    ax.set(xlabel="time to first token (s)", ylabel="fraction of requests", title="TTFT CDF, chat workload")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def prefix_caching(path: Path, pair: dict[str, Any]) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
    labels = ["on", "off"]
    left.bar(labels, [pair[k]["prompt_tokens_computed"] for k in labels], color=["#3b7dd8", "#999999"])
    left.set(title="prompt tokens computed", xlabel="prefix caching")
    right.bar(labels, [pair[k]["ttft_p50_s"] for k in labels], color=["#3b7dd8", "#999999"])
    right.set(title="TTFT p50 (s)", xlabel="prefix caching")
    fig.suptitle("Shared system prompt: prefix caching on vs off")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
