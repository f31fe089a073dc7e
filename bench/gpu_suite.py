"""The prepared GPU run (issue 19): ``python -m bench.gpu_suite --out gpu.json``, about 5 minutes on one
GPU, with every figure of BENCHMARKS.md's GPU table, saved to JSON after each section.

1. ``kernels``: the kernel tests compiled on the GPU (slow ones included: every dtype and block size they cover),
   then ``bench.kernels``'s attention table: decode at batch 64 x 4,096 and other shapes, Triton against the
   torch reference and SDPA over the same K/V gathered contiguous, bandwidth against the measured copy bandwidth.
2. ``oracle``: random-weight models of SmolLM2-135M's shape and of Llama-3.2-1B's layer shapes, built on the device
   (no weights travel); our engine's greedy tokens against HF transformers' ``generate`` on the same weights, in
   float32 (they should be equal) and bfloat16 (agreement reported, and ours against our own float32).
3. ``throughput``: a 256-request chat workload in bfloat16 on the SmolLM2-shaped model, our engine's pool sized by
   ``gpu_memory_utilization=0.9`` against HF ``generate`` in static padded batches under the same KV memory
   (``bench``'s own adapters and KV accounting: blocks held, slot utilisation, preemptions).
4. ``host``: the engine step at 256 sequences on the same model (issue 41: at most 5 ms), timed part by part with
   ``bench.host_overhead``'s timers: scheduling, batch building, forward, logits, sampling, the rest.

A section that fails is saved with its traceback and the next one still runs. Without CUDA (or with
``--cpu-smoke``) the same code runs on tiny shapes on the CPU, so the test suite keeps every path working
between GPU runs. Prompts are token ids and the engine detokenises, so a tokenizer folder is needed:
``--tokenizer`` (default: the built-in model's folder). A GPU machine without the model is sent its three
tokenizer files; each random model uses SmolLM2's vocabulary so that tokenizer serves it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import platform
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bench import host_overhead, workloads
from bench.engines import hf_static, ours
from bench.engines.base import RunConfig
from bench.kv import KVGeometry
from inference.model_loader import TOKENIZER_FILES
from bench import kernels as kernel_bench

VOCAB_SIZE = 49152  # SmolLM2's tokenizer, shared by every random model here
BEAM_WIDTH, BEAM_PROMPTS = 4, 3  # beam search checked on the first prompts, half the greedy length
KERNEL_TESTS_TIMEOUT_S = 200  # on 8 workers the whole kernel suite compiles and runs well inside this


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family shape to build with random weights; tied embeddings and plain RoPE, as SmolLM2 has."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float = 100000.0

    def hf_config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                           num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                           head_dim=self.hidden_size // self.num_heads, max_position_embeddings=2048,
                           rms_norm_eps=1e-5, rope_theta=self.rope_theta, tie_word_embeddings=True,
                           bos_token_id=1, eos_token_id=2)


SMOLLM2 = ModelShape("SmolLM2-135M", 576, 1536, 30, 9, 3)
LLAMA_1B_LIKE = ModelShape("Llama-3.2-1B-like", 2048, 8192, 16, 32, 8, rope_theta=500000.0)
TINY = ModelShape("tiny", 64, 128, 2, 4, 2)


@dataclass(frozen=True)
class Plan:
    """What one run does: the models, the oracle's prompts, and the throughput workload."""

    oracle_models: tuple[ModelShape, ...]
    prompt_lengths: tuple[int, ...]
    oracle_tokens: int
    throughput_model: ModelShape
    chat: workloads.WorkloadSpec
    kv_budgets: tuple[int | None, ...]  # KV token slots per throughput run; None: gpu_memory_utilization=0.9
    max_num_seqs: int
    max_num_batched_tokens: int
    host_sequences: int  # the host section's batch


GPU_PLAN = Plan((SMOLLM2, LLAMA_1B_LIKE), (5, 17, 40, 64, 129, 300, 700, 1500), 32, SMOLLM2,
                workloads.WorkloadSpec(256, (20, 400), (16, 128)), (None, 23296), 256, 8192, 256)
CPU_PLAN = Plan((TINY,), (5, 17, 40), 6, TINY, workloads.WorkloadSpec(4, (20, 60), (4, 8)), (2048,), 4, 2048, 8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_suite", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results (rewritten per section)")
    parser.add_argument("--tokenizer", type=Path, help="folder with the tokenizer files (default: the built-in model)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (automatic without CUDA)")
    parser.add_argument("--sections", help="comma-separated subset to run (default: all; throughput sections are "
                        "named throughput (gpu_memory_utilization) and throughput_<budget>)")
    parser.add_argument("--skip-kernel-tests", action="store_true", help="the kernels section without its tests")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available() and not args.cpu_smoke
    device = torch.device("cuda" if on_gpu else "cpu")
    plan = GPU_PLAN if on_gpu else CPU_PLAN
    tokenizer_dir = args.tokenizer or _builtin_model_folder()
    results: dict[str, Any] = {"machine": machine(on_gpu), "sections": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-suite-") as tmp:
        sections: dict[str, Callable[[], dict[str, Any]]] = {
            "kernels": lambda: kernels_section(on_gpu, not args.skip_kernel_tests),
            "oracle": lambda: oracle_section(plan, device, tokenizer_dir, Path(tmp)),
        }
        for budget in plan.kv_budgets:  # one section each, so a slow second one cannot cost the first's figures
            sections[_throughput_name(budget)] = functools.partial(throughput_section, plan, device, tokenizer_dir,
                                                                   Path(tmp), budget)
        sections["host"] = lambda: host_section(plan, device, tokenizer_dir, Path(tmp))
        for name in args.sections.split(",") if args.sections else sections:
            started = time.perf_counter()
            try:
                outcome = {"ok": True, **sections[name]()}
            except Exception:  # record and go on: one broken section must not cost the others' figures
                outcome = {"ok": False, "error": traceback.format_exc()}
            outcome["seconds"] = round(time.perf_counter() - started, 1)
            results["sections"][name] = outcome
            print(f"[{name}] {'ok' if outcome['ok'] else 'FAILED'} in {outcome['seconds']} s", flush=True)
            if not outcome["ok"]:
                print(outcome["error"], flush=True)
            args.out.write_text(json.dumps(results, indent=1))
            _free_device_memory()
    print(summary(results))
    return 0 if all(s["ok"] for s in results["sections"].values()) else 1


def machine(on_gpu: bool) -> dict[str, Any]:
    """Device, driver and library versions, and the date: the GPU table's header."""
    import transformers

    info: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
                            "transformers": transformers.__version__, "python": platform.python_version()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, multiprocessors=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info["driver"] = None
    else:
        info["device"] = "cpu (smoke run, tiny shapes)"
    return info


def kernels_section(on_gpu: bool, run_tests: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if run_tests:
        tests = kernel_bench.run_kernel_tests(on_gpu, full=on_gpu, timeout_s=KERNEL_TESTS_TIMEOUT_S)
        out.update(tests=tests.summary, tests_passed=tests.returncode == 0)
    rows, copy_gbps, notes = kernel_bench.attention_table(on_gpu)
    return {**out, "copy_gbps": copy_gbps, "attention": [row.as_dict(copy_gbps) for row in rows], "notes": notes}


# --- the greedy oracle -------------------------------------------------------------------------------------


def random_model_folder(shape: ModelShape, folder: Path, tokenizer_dir: Path, device: torch.device,
                        seed: int = 0) -> Path:
    """Build `shape` with seeded random weights on `device` and save it (bfloat16 values, so float32 and
    bfloat16 loads start from the same numbers) with the tokenizer files; returns the folder."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(shape.hf_config())
    with torch.no_grad():
        for param in model.parameters():  # larger than the default init, so each argmax is decisive
            param.normal_(0, 0.2)
    model.to(torch.bfloat16).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)
    del model
    _free_device_memory()
    return folder


def oracle_prompts(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    """Seeded random token ids (not text: the models are random too), one prompt per length."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]


def hf_greedy(folder: Path, dtype: torch.dtype, device: torch.device, prompts: list[list[int]],
              max_tokens: int) -> list[list[int]]:
    """HF transformers' greedy tokens, one prompt at a time (no padding to disturb the numbers)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    config = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              eos_token_id=None, pad_token_id=0)
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=device)
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            out.append(generated[0, len(prompt):].tolist())
    del model
    _free_device_memory()
    return out


@contextlib.contextmanager
def our_llm(folder: Path, device: torch.device, dtype: str, prompts: list[list[int]], max_tokens: int,
            per_prompt: int = 1) -> Iterator[Any]:
    """Our engine with KV for `per_prompt` sequences of every prompt (plus one of max_model_len), Triton attention
    on CUDA (and on the CPU under TRITON_INTERPRET=1); on leaving, every block must be free and every ref count
    exact (`check_integrity`), and its memory is released."""
    from inference import LLM

    blocks = 2048 // 16 + per_prompt * sum(-(-(len(p) + max_tokens) // 16) for p in prompts)
    llm = LLM(model=str(folder), device=device.type, dtype=dtype, num_kv_blocks=blocks,
              max_num_seqs=per_prompt * len(prompts),
              attention_backend="triton" if device.type == "cuda" or kernel_bench.interpreting() else None)
    try:
        yield llm
        llm.llm_engine.check_integrity()
    finally:
        llm.close()
        _free_device_memory()


def ours_greedy(folder: Path, dtype: torch.dtype, device: torch.device, prompts: list[list[int]],
                max_tokens: int) -> list[list[int]]:
    """Our engine's greedy tokens for every prompt, in one continuous batch."""
    from inference import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with our_llm(folder, device, str(dtype).removeprefix("torch."), prompts, max_tokens) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def hf_beams(folder: Path, device: torch.device, prompts: list[list[int]], width: int,
             max_tokens: int) -> list[list[list[int]]]:
    """HF transformers' beam search in float32: every prompt's `width` hypotheses, best first, cut after EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    eos = model.config.eos_token_id
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=device)
            rows = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                  num_beams=width, num_return_sequences=width, do_sample=False)
            out.append([row[: row.index(eos) + 1] if eos in row else row for row in rows[:, len(prompt):].tolist()])
    del model
    _free_device_memory()
    return out


def ours_beams(folder: Path, device: torch.device, prompts: list[list[int]], width: int,
               max_tokens: int) -> list[list[list[int]]]:
    """Our engine's beam search in float32 (beams share their prompt's blocks and fork on the device)."""
    from inference import BeamSearchParams

    with our_llm(folder, device, "float32", prompts, max_tokens, per_prompt=width) as llm:
        outputs = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                                  BeamSearchParams(beam_width=width, max_tokens=max_tokens), use_tqdm=False)
    return [[list(c.token_ids) for c in o.outputs] for o in outputs]


def agreement(ours_tokens: list[list[int]], reference: list[list[int]]) -> dict[str, Any]:
    """Identical sequences, the share of positions with equal tokens, and where each pair first differs."""
    pairs = list(zip(ours_tokens, reference))
    equal = sum(a == b for x, y in pairs for a, b in zip(x, y))
    return {"identical": sum(x == y for x, y in pairs), "sequences": len(pairs),
            "position_agreement": equal / sum(len(y) for _, y in pairs),
            "first_difference": [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in pairs]}


def oracle_section(plan: Plan, device: torch.device, tokenizer_dir: Path, tmp: Path) -> dict[str, Any]:
    prompts = oracle_prompts(plan.prompt_lengths)
    out: dict[str, Any] = {"prompt_lengths": list(plan.prompt_lengths), "max_tokens": plan.oracle_tokens}
    for shape in plan.oracle_models:
        folder = random_model_folder(shape, tmp / shape.name, tokenizer_dir, device)
        ours32, hf32, ours16, hf16 = (greedy(folder, dtype, device, prompts, plan.oracle_tokens)
                                      for dtype in (torch.float32, torch.bfloat16)
                                      for greedy in (ours_greedy, hf_greedy))
        beam_prompts = prompts[:BEAM_PROMPTS]
        beams = agreement(ours_beams(folder, device, beam_prompts, BEAM_WIDTH, plan.oracle_tokens // 2),
                          hf_beams(folder, device, beam_prompts, BEAM_WIDTH, plan.oracle_tokens // 2))
        out[shape.name] = {"shape": shape.__dict__, "float32_vs_hf": agreement(ours32, hf32),
                           "bfloat16_vs_hf": agreement(ours16, hf16), "bfloat16_vs_float32": agreement(ours16, ours32),
                           "hf_bfloat16_vs_hf_float32": agreement(hf16, hf32), "beam_float32_vs_hf": beams}
        if shape != plan.throughput_model:
            shutil.rmtree(folder, ignore_errors=True)
    return out


# --- throughput against HF static batching ------------------------------------------------------------------


def throughput_section(plan: Plan, device: torch.device, tokenizer_dir: Path, tmp: Path,
                       budget: int | None) -> dict[str, Any]:
    """The chat workload on our engine, then on HF static batches given the KV slots our engine took
    (`budget` token slots, or with None as many as `gpu_memory_utilization=0.9` gives it)."""
    from transformers import AutoConfig, AutoTokenizer

    folder = _throughput_model(plan, device, tokenizer_dir, tmp)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    workload = workloads.build("chat", AutoTokenizer.from_pretrained(folder), seed=0, spec=plan.chat)
    config = RunConfig(model_path=folder, geometry=KVGeometry.from_hf_config(AutoConfig.from_pretrained(folder), dtype),
                       kv_budget_tokens=budget, max_num_seqs=plan.max_num_seqs,
                       max_num_batched_tokens=plan.max_num_batched_tokens, dtype=dtype, device=device.type)
    started = time.perf_counter()
    engine = ours.make_engine(config)
    config = replace(config, kv_budget_tokens=engine.runner.num_blocks * config.block_size)
    _progress(f"our engine: {engine.runner.num_blocks} blocks, ready in {time.perf_counter() - started:.1f} s")
    ours_figures = ours.run(workload, config, engine=engine).figures(config)
    _progress(f"ours: {ours_figures['output_tokens_per_s']:.0f} output tok/s in {ours_figures['elapsed_s']:.1f} s")
    engine.check_integrity()  # every block freed, every ref count exact
    engine.close()
    del engine
    _free_device_memory()
    hf_figures = hf_static.run(workload, config).figures(config)
    _progress(f"hf_static: {hf_figures['output_tokens_per_s']:.0f} output tok/s in {hf_figures['elapsed_s']:.1f} s")
    return {"dtype": dtype, "kv_budget_tokens": config.kv_budget_tokens, "max_num_seqs": plan.max_num_seqs,
            "sized_by": "gpu_memory_utilization=0.9" if budget is None else "fixed",
            "workload": {"requests": len(workload.requests), "output_tokens": workload.total_output_tokens,
                         "prompt_tokens": sum(r.num_prompt_tokens for r in workload.requests),
                         "padded_row_len": workload.padded_row_len},
            "ours": ours_figures, "hf_static": hf_figures,
            "ratio_output_tokens_per_s": ours_figures["output_tokens_per_s"] / hf_figures["output_tokens_per_s"]}


def host_section(plan: Plan, device: torch.device, tokenizer_dir: Path, tmp: Path) -> dict[str, Any]:
    """`plan.host_sequences` sequences of 16-token prompts, 64 tokens each, all at once, on the throughput model:
    ms per engine step, part by part. On a GPU the forward's kernels run asynchronously, so the device's own time
    shows up where the host first waits for it (sampling reads the tokens back)."""
    folder = _throughput_model(plan, device, tokenizer_dir, tmp)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    config = replace(host_overhead.run_config(folder, plan.host_sequences, dtype=dtype), device=device.type)
    engine = ours.make_engine(config)
    try:
        figures = host_overhead.split(engine, host_overhead.workload(plan.host_sequences))
        engine.check_integrity()  # every block freed, every ref count exact
    finally:
        engine.close()
    return {"dtype": dtype, "sequences": plan.host_sequences, **figures}


def _throughput_model(plan: Plan, device: torch.device, tokenizer_dir: Path, tmp: Path) -> Path:
    """The throughput model's folder, built once a run."""
    folder = tmp / plan.throughput_model.name
    if not (folder / "config.json").is_file():
        random_model_folder(plan.throughput_model, folder, tokenizer_dir, device)
    return folder


def _progress(message: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {message}", flush=True)


# --- the printed summary -----------------------------------------------------------------------------------------


def summary(results: dict[str, Any]) -> str:
    """The figures BENCHMARKS.md's GPU table takes, as lines of text."""
    lines = [json.dumps(results["machine"])]
    sections = results["sections"]
    kernels = sections.get("kernels", {})
    if kernels.get("ok"):
        lines.append(f"kernel tests: {kernels.get('tests', 'not run')}; copy {kernels['copy_gbps']:.0f} GB/s")
        lines += [f"  {r['label']}: triton {r['triton_ms'] or 0:.3f} ms, {r['triton_gbps'] or 0:.0f} GB/s "
                  f"({100 * (r['share_of_copy_bandwidth'] or 0):.0f}% of copy), reference {r['reference_ms']:.3f} ms, "
                  f"contiguous SDPA {r['contiguous_ms']:.3f} ms, max err {r['max_error']}" for r in kernels["attention"]]
    oracle = sections.get("oracle", {})
    for name, entry in oracle.items() if oracle.get("ok") else ():
        if isinstance(entry, dict) and "float32_vs_hf" in entry:
            lines += [f"oracle {name} {key}: {v['identical']}/{v['sequences']} identical, "
                      f"{100 * v['position_agreement']:.1f}% of positions" for key, v in entry.items() if key != "shape"]
    for name, entry in sections.items():
        if not (name.startswith("throughput") and entry.get("ok")):
            continue
        lines.append(f"{name}: KV budget {entry['kv_budget_tokens']} tokens ({entry['sized_by']}):")
        for engine in ("ours", "hf_static"):
            f = entry[engine]
            lines.append(f"  {engine}: {f['output_tokens_per_s']:.0f} output tok/s, TTFT p50 {f['ttft_p50_s']:.3f} s, "
                         f"KV peak {f['kv_peak_reserved_bytes'] / 2**30:.2f} GiB, slot utilisation "
                         f"{f['kv_slot_utilization_avg']:.2f}, preemptions {f['num_preemptions']}, "
                         f"most running {f['max_concurrent_requests']}")
        lines.append(f"  ours / HF static: {entry['ratio_output_tokens_per_s']:.2f}x")
    host = sections.get("host", {})
    if host.get("ok"):
        parts = ", ".join(f"{phase} {ms:.2f}" for phase, ms in host["ms_per_step"].items())
        lines.append(f"host: {host['step_ms']:.2f} ms a step at {host['sequences']} sequences over {host['steps']} "
                     f"steps ({parts} ms)")
    return "\n".join(lines)


def _throughput_name(budget: int | None) -> str:
    return "throughput" if budget is None else f"throughput_{budget}"


def _builtin_model_folder() -> Path:
    from inference.model_loader import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


def _free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    raise SystemExit(main())
