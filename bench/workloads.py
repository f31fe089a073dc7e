"""Seeded benchmark workloads, saved and loaded as JSONL so any run can be repeated exactly.

A workload is a list of requests already tokenised through the model's chat template: every engine receives
the very same prompt token ids and generates exactly `max_tokens` tokens (the engines run with EOS ignored),
so throughput figures compare equal work.

Kinds (the issue's names): `chat` (mixed prompt and output lengths), `shared-prefix` (one ~300-token system
prompt shared by every request), `parallel` (n=4 samples per prompt), `beam` (beam width 4) and `long` (prompts
near `max_model_len`). Arrivals are all at once (time 0) or Poisson at a given request rate.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench import textgen

KINDS = ("chat", "shared-prefix", "parallel", "beam", "long")
SHORT_SYSTEM_PROMPT = "Be helpful."


class ChatTokenizer(Protocol):
    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> Any: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass
class BenchRequest:
    """One request of a workload; `arrival_time` is seconds after the run starts."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_time: float = 0.0
    n: int = 1
    beam_width: int = 1

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class Workload:
    kind: str
    seed: int
    requests: list[BenchRequest]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total_output_tokens(self) -> int:
        """Tokens every engine must generate: n (or beam width) samples of max_tokens per request."""
        return sum(r.max_tokens * max(r.n, 1) for r in self.requests)

    @property
    def padded_row_len(self) -> int:
        """Longest prompt + longest output: how long a row of a static padded batch can get (the two may
        come from different requests), so what a static server must reserve per row to never overflow."""
        return max(r.num_prompt_tokens for r in self.requests) + max(r.max_tokens for r in self.requests)


@dataclass(frozen=True)
class WorkloadSpec:
    """How many requests, and the ranges their prompt and output lengths are drawn from (uniform)."""

    num_requests: int
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]


# `chat` has the 64 requests and prompt lengths, but outputs up to 128 rather than 256 tokens: at 256,
# HF's static batches alone took 25 min under a load average of ~5 on the 2 shared cores (`--chat-max-output
# 256` restores it). The side experiments are smaller still: a full run took 7 min at load ~2, 17 min at ~4.
# `shared-prefix` is a playground with 32 users who all share one ~300-token system prompt and ask short
# questions (10-50 tokens of their own, after the chat template): what prefix caching can save is bounded by
# the share of the suffixes (see `experiments.prefix_caching`'s ideal_reduction), so the suffix lengths are
# part of the workload's definition. `--quick` shrinks everything (see QUICK_SPECS).
FULL_SPECS = {
    "chat": WorkloadSpec(64, (20, 400), (16, 128)),
    "shared-prefix": WorkloadSpec(32, (322, 362), (8, 8)),
    "parallel": WorkloadSpec(4, (20, 400), (32, 32)),
    "beam": WorkloadSpec(4, (40, 120), (32, 32)),
    "long": WorkloadSpec(2, (0, 0), (16, 16)),
}
QUICK_SPECS = {
    "chat": WorkloadSpec(8, (20, 80), (4, 12)),
    "shared-prefix": WorkloadSpec(3, (330, 360), (2, 2)),
    "parallel": WorkloadSpec(2, (30, 60), (8, 8)),
    "beam": WorkloadSpec(2, (30, 60), (6, 6)),
    "long": WorkloadSpec(1, (0, 0), (2, 2)),
}
SHARED_SYSTEM_PROMPT_TOKENS = 300


def build(
    kind: str,
    tokenizer: ChatTokenizer,
    seed: int = 0,
    spec: WorkloadSpec | None = None,
    max_model_len: int = 2048,
    arrival: str = "all",
    rate: float | None = None,
) -> Workload:
    """Make a seeded workload of `kind`; `arrival` is "all" (everything at t=0) or "poisson" at `rate` req/s."""
    if kind not in KINDS:
        raise ValueError(f"unknown workload kind {kind!r}; choose one of {', '.join(KINDS)}")
    spec = spec or FULL_SPECS[kind]
    rng = random.Random(f"{kind}:{seed}")
    shared_system = _system_prompt_of_tokens(rng, tokenizer, SHARED_SYSTEM_PROMPT_TOKENS) if kind == "shared-prefix" else None
    requests = []
    for i in range(spec.num_requests):
        max_tokens = rng.randint(*spec.output_tokens)
        if kind == "long":
            # Near max_model_len, leaving room for the output and a small random margin.
            target = max_model_len - max_tokens - rng.randint(1, 32)
        else:
            target = rng.randint(*spec.prompt_tokens)
        ids = _prompt_of_tokens(rng, tokenizer, target, shared_system or SHORT_SYSTEM_PROMPT)
        requests.append(
            BenchRequest(
                request_id=f"{kind}-{i}",
                prompt_token_ids=ids,
                max_tokens=max_tokens,
                n=4 if kind == "parallel" else 1,
                beam_width=4 if kind == "beam" else 1,
            )
        )
    _set_arrivals(requests, rng, arrival, rate)
    meta = {"arrival": arrival, "rate": rate, "max_model_len": max_model_len, "num_requests": spec.num_requests,
            "prompt_tokens": list(spec.prompt_tokens), "output_tokens": list(spec.output_tokens)}
    return Workload(kind=kind, seed=seed, requests=requests, meta=meta)


def _set_arrivals(requests: list[BenchRequest], rng: random.Random, arrival: str, rate: float | None) -> None:
    if arrival == "all":
        return
    if arrival != "poisson":
        raise ValueError(f"arrival must be 'all' or 'poisson', got {arrival!r}")
    if rate is None or rate <= 0:
        raise ValueError(f"poisson arrivals need a positive --rate (requests/s), got {rate!r}")
    t = 0.0
    for request in requests:
        request.arrival_time = t
        t += rng.expovariate(rate)


def encode_chat(tokenizer: ChatTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` through the chat template, ending with the assistant's generation prompt."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _prompt_of_tokens(rng: random.Random, tokenizer: ChatTokenizer, target: int, system: str) -> list[int]:
    """A templated chat prompt of about `target` tokens (never more): a generated message cut to fit."""
    words = textgen.user_message(rng, num_sentences=2 + target // 10).split()

    def encode(num_words: int) -> list[int]:
        return encode_chat(tokenizer, [{"role": "system", "content": system},
                                       {"role": "user", "content": " ".join(words[:num_words])}])

    if len(encode(1)) > target:
        return encode(1)  # the template itself is longer than the target: the shortest real prompt
    lo, hi = 1, len(words)  # largest word count whose prompt fits in target tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(encode(mid)) <= target:
            lo = mid
        else:
            hi = mid - 1
    return encode(lo)


def _system_prompt_of_tokens(rng: random.Random, tokenizer: ChatTokenizer, target: int) -> str:
    """A system prompt whose own tokens number at least `target` (one sentence at a time)."""
    sentences = 1
    while True:
        text = textgen.system_prompt(random.Random(rng.random()), sentences)
        if len(tokenizer.encode(text, add_special_tokens=False)) >= target:
            return text
        sentences += 1


def save(workload: Workload, path: Path) -> None:
    """One JSON header line (kind, seed, meta), then one line per request."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(json.dumps({"kind": workload.kind, "seed": workload.seed, "meta": workload.meta}) + "\n")
        for request in workload.requests:
            f.write(json.dumps(asdict(request)) + "\n")


def load(path: Path) -> Workload:
    lines = Path(path).read_text().splitlines()
    if not lines:
        raise ValueError(f"{path} is empty; expected a workload header line")
    header = json.loads(lines[0])
    if "kind" not in header:
        raise ValueError(f"{path}: the first line must be the workload header with 'kind'")
    requests = [BenchRequest(**json.loads(line)) for line in lines[1:] if line.strip()]
    return Workload(kind=header["kind"], seed=header["seed"], requests=requests, meta=header.get("meta", {}))
