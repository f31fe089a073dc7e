"""The quantization experiment: one column per weight format (fp32, bf16, int8, int4, the bundled GGUF Q4_1).

For each: resident weight MiB (the engine's own `weight_bytes`), the chat workload's output tok/s and TTFT
(all arriving at once), decode tok/s of one sequence alone and of 64 at once (short prompts), the time of
one token's weight matmuls alone (the part of a step the format changes), and, against
float32 on one fixed text, the share of positions whose argmax agrees and the mean KL(float32 || variant) of
the next-token distributions: the text fed as one prompt, and again one token a forward pass (the decode path,
where the tiled int4 / int8 GEMV rounds its inputs to int8). Beside them, llama.cpp's server decoding one
stream on the very GGUF file (when built). Quantized variants run bfloat16
activations, the fast path of torch's CPU int4/int8 kernels.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from inference import LLMEngine, SamplingParams
from bench.engines import llamacpp_server, ours
from bench.engines.base import RunConfig
from bench.workloads import Workload
from inference.linear import Linear
from inference.model import AttentionMetadata

# name -> (quantization, activation dtype)
VARIANTS: dict[str, tuple[str | None, str]] = {
    "fp32": (None, "float32"),
    "bf16": (None, "bfloat16"),
    "int8": ("int8", "bfloat16"),
    "int4": ("int4", "bfloat16"),
    "gguf-q4_1": ("gguf", "bfloat16"),
}
FIXED_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press into a system that could produce books far "
    "faster than scribes. Within fifty years presses were running in more than two hundred cities across "
    "Europe, and the price of a book fell so far that ordinary merchants could own several. Literacy spread, "
    "scientific results could be checked against identical copies, and vernacular languages gained a "
    "standard written form. Historians still argue about how much of the Reformation, the scientific "
    "revolution and the rise of newspapers the press caused, and how much it merely accelerated."
)
DECODE_TOKENS = 48


def measure(chat: Workload, config: RunConfig, names: tuple[str, ...] = tuple(VARIANTS),
            decode_tokens: int = DECODE_TOKENS, progress: bool = False) -> dict[str, Any]:
    """The variants `names` on the same chat workload, decode and fixed text; float32 runs first (the
    reference) whether named or not."""
    rows: dict[str, dict[str, Any]] = {}
    reference: torch.Tensor | None = None
    for name in ["fp32", *(n for n in names if n != "fp32")]:
        quantization, dtype = VARIANTS[name]
        engine = ours.make_engine(dataclasses.replace(config, dtype=dtype), quantization=quantization)
        log_probs, decode_log_probs = text_log_probs(engine), text_log_probs(engine, chunk=1)
        if reference is None:
            reference = log_probs
        figures = ours.run(chat, config, engine=engine, progress=progress).figures(config)
        rows[name] = {
            "quantization": quantization, "dtype": dtype,
            "weight_mib": engine.metrics(block_map=False)["weight_bytes"] / 2**20,
            "chat_output_tok_s": figures["output_tokens_per_s"], "ttft_p50_s": figures["ttft_p50_s"],
            "decode_batch1_tok_s": decode_tok_s(engine, 1, decode_tokens),
            "decode_batch64_tok_s": decode_tok_s(engine, 64, decode_tokens),
            "weight_matmul_ms_batch1": weight_matmul_ms(engine),
            "argmax_agreement_vs_fp32": (log_probs.argmax(-1) == reference.argmax(-1)).float().mean().item(),
            "mean_kl_vs_fp32": (reference.exp() * (reference - log_probs)).sum(-1).mean().item(),
            "decode_argmax_agreement_vs_fp32": (decode_log_probs.argmax(-1) == reference.argmax(-1)).float().mean().item(),
            "decode_mean_kl_vs_fp32": (reference.exp() * (reference - decode_log_probs)).sum(-1).mean().item(),
        }
        del engine
    out = {"text_tokens": int(reference.shape[0]), "decode_tokens": decode_tokens, "variants": rows,
           "chat_requests": len(chat.requests)}
    if llamacpp_server.available():  # the same GGUF file, one stream on one slot
        out["llamacpp_server_decode_batch1_tok_s"] = llamacpp_server.decode_tok_s(config, decode_tokens)
    else:
        out["llamacpp_server_skipped"] = llamacpp_server.unavailable_reason()
    return out


def text_log_probs(engine: LLMEngine, chunk: int | None = None) -> torch.Tensor:
    """float32 next-token log-probs at every position of FIXED_TEXT, from a fresh engine: one prefill, or with
    `chunk`, `chunk` tokens a forward pass (1: the decode path, whose small matmuls may run other kernels, e.g.
    the tiled int4 GEMV with its int8-rounded inputs).

    The engine must be idle with nothing cached: the text's K/V go into blocks 0, 1, ... directly.
    """
    runner, device = engine.runner, engine.runner.device
    ids = engine.tokenizer.encode(FIXED_TEXT, add_special_tokens=False)
    n, bs = len(ids), runner.block_size
    table = torch.tensor([list(range(-(-n // bs)))], dtype=torch.int32, device=device)
    logits = []
    for start in range(0, n, chunk or n):
        end = min(n, start + (chunk or n))
        meta = AttentionMetadata(
            slot_mapping=torch.arange(start, end, device=device), block_tables=table,
            context_lens=torch.tensor([end], dtype=torch.int32, device=device),
            query_start_loc=torch.tensor([0, end - start], dtype=torch.int32, device=device),
            is_decode=end - start == 1,
        )
        positions = torch.arange(start, end, device=device)
        hidden = runner.model(torch.tensor(ids[start:end], device=device), positions, runner.kv_caches, meta, runner.ops)
        logits.append(runner.model.compute_logits(hidden))
    return torch.log_softmax(torch.cat(logits)[:-1], dim=-1)


@torch.inference_mode()
def weight_matmul_ms(engine: LLMEngine, repeats: int = 5) -> float:
    """Best-of-`repeats` time of every weight matmul of one decode token (all Linear layers, lm_head
    included, at batch 1): the part of a step that the weight format changes."""
    runner = engine.runner
    layers = [m for m in runner.model.modules() if isinstance(m, Linear)]
    inputs = [torch.randn(1, m.in_features, device=runner.device).to(runner.dtype) for m in layers]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for layer, x in zip(layers, inputs):
            layer(x)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def decode_tok_s(engine: LLMEngine, batch: int, tokens: int) -> float:
    """Decode rate of `batch` sequences of 32 prompt tokens: tokens after each one's first, over that time."""
    for i in range(batch):
        engine.add_request(f"decode-{batch}-{i}", {"prompt_token_ids": list(range(2000 + i, 2032 + i))},
                           SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    while engine.scheduler.waiting:  # prefill everyone (and their first tokens) outside the timing
        engine.step()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return batch * (tokens - 1) / (time.perf_counter() - start)
