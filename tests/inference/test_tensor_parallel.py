"""Tensor parallelism on CPU (gloo): greedy output under TP equals TP=1 and HF token for token, and a rank's
death ends every request with an error within seconds, leaving no process behind.

SmolLM2 (9 query / 3 KV heads) runs with TP=3; tiny random models (4 / 2 heads) with TP=2. Each engine here
starts its own rank processes, so each is built once per module and closed at its end; rank processes run
one torch thread each (the test process' two, split).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference import LLM, EngineDeadError, SamplingParams, StreamingEngine
from bench import tensor_parallel as tensor_parallel_bench
from inference.lab import LabConfig, LabSession
from inference.parallel.group import Group
from inference.parallel.layers import WeightShards
from inference.parallel.ranks import RankFailedError
from tests.inference.engines import assert_idle
from tests.inference.oracle_prompts import ORACLE_PROMPTS
from tests.inference.tiny_models import SHAPE, save_tiny

pytestmark = pytest.mark.slow

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
REPO = Path(__file__).resolve().parents[2]
TP1_BLOCK_BYTES = 2 * 30 * 16 * 3 * 64 * 4  # SmolLM2: 30 layers, 3 KV heads of 64, float32, block of 16


def assert_gone(pids: list[int]) -> None:
    """No process with these ids is left (not even a zombie: the engine reaps its ranks)."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def greedy_tokens(llm: LLM, prompts, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def hf_tokens(llm: LLM, hf_greedy, prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [hf_greedy(tok.encode(p, add_special_tokens=False), max_tokens) for p in prompts]


@pytest.fixture(scope="module")
def smollm_tp3():
    """SmolLM2 on 3 ranks, with the per-device KV budget that gives TP=1 256 blocks."""
    with LLM(kv_cache_memory=256 * TP1_BLOCK_BYTES, tensor_parallel_size=3) as llm:
        yield llm


# --- before any process starts ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor_parallel_size=2), "tensor_parallel_size=2 does not divide the model's num_attention_heads=9"),
    (dict(tensor_parallel_size=3, quantization="gguf"), "does not support quantization='gguf' yet"),
    (dict(tensor_parallel_size=3, enable_lora=True), "does not support enable_lora yet"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
], ids=["heads", "gguf", "lora", "zero"])
def test_what_cannot_run_is_a_value_error_before_any_process_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(num_kv_blocks=64, **kwargs)
    assert rank_processes() == []


def test_the_kv_heads_are_checked_too(tiny_llama):
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        LLM(model=str(tiny_llama[0]), num_kv_blocks=64, tensor_parallel_size=4)
    assert rank_processes() == []


def rank_processes() -> list[int]:
    """Ids of this process's children that run a rank (alive or not yet reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if f"PPid:\t{os.getpid()}\n" in status and b"inference.parallel.rank_process" in command:
            found.append(int(entry.name))
    return found


def test_each_rank_keeps_its_rows_or_columns_and_the_last_vocabulary_shard_is_padded():
    cfg = SimpleNamespace(num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=5)
    first, last = (WeightShards(cfg, Group(rank, 2)) for rank in (0, 1))
    table = torch.arange(5 * 64, dtype=torch.float32).view(5, 64)
    assert torch.equal(first.take("embed_tokens.weight", table), table[:3])
    assert torch.equal(last.take("embed_tokens.weight", table), torch.cat([table[3:], torch.zeros(1, 64)]))
    down = torch.arange(64 * 128, dtype=torch.float32).view(64, 128)
    assert torch.equal(last.take("layers.0.mlp.down_proj.weight", down), down[:, 64:])
    k = torch.arange(32 * 64, dtype=torch.float32).view(32, 64)  # 2 KV heads of 16: rank 1 keeps the second
    assert torch.equal(last.take("layers.1.self_attn.k_proj.weight", k), k[16:])
    assert torch.equal(last.take("norm.weight", table[0]), table[0])


# --- SmolLM2, TP=3 ------------------------------------------------------------------------------------

def test_smollm2_tp3_greedy_equals_hf_in_one_continuous_batch(smollm_tp3, hf_greedy):
    assert greedy_tokens(smollm_tp3, ORACLE_PROMPTS) == hf_tokens(smollm_tp3, hf_greedy, ORACLE_PROMPTS)
    assert_idle(smollm_tp3)


def test_the_pool_holds_n_times_the_blocks_in_the_same_per_device_memory(smollm_tp3):
    metrics = smollm_tp3.metrics()
    assert metrics["tensor_parallel_size"] == 3
    assert sorted(rank_processes()) == sorted(smollm_tp3.llm_engine.runner.ranks.pids)  # 2 rank processes
    assert metrics["num_blocks_total"] == 3 * 256
    assert metrics["kv_pool_bytes_per_rank"] == 256 * TP1_BLOCK_BYTES
    assert metrics["kv_pool_bytes"] == 3 * metrics["kv_pool_bytes_per_rank"]
    assert metrics["weight_bytes"] == 3 * metrics["weight_bytes_per_rank"]
    # A rank holds a third of the layers' weights and of the (tied) vocabulary table, and all of the norms;
    # on the CPU the LM head also multiplies by a packed copy of its third of the table (PackedFloatWeight).
    table_third = 49152 * 576 * 4 // 3
    assert metrics["weight_bytes_per_rank"] < 0.34 * 134_515_008 * 4 + table_third


def test_prefix_caching_under_tp(smollm_tp3, hf_greedy):
    smollm_tp3.reset_prefix_cache()
    system = "You are a careful assistant. Answer briefly and never invent facts. " * 6
    prompts = [system + "Name a river.", system + "Name a mountain."]
    first = greedy_tokens(smollm_tp3, prompts[:1])
    hits = smollm_tp3.metrics()["prefix_cache_hits_total"]
    second = greedy_tokens(smollm_tp3, prompts[1:])
    assert smollm_tp3.metrics()["prefix_cache_hits_total"] > hits
    assert first + second == hf_tokens(smollm_tp3, hf_greedy, prompts)
    assert_idle(smollm_tp3)


def test_prompt_logprobs_and_logit_bias_under_tp(smollm_tp3, hf_model):
    # The prompt-logprob rows travel in the step's broadcast batch; every rank computes them, rank 0 reads them.
    tok = smollm_tp3.get_tokenizer()
    prompt = max(ORACLE_PROMPTS, key=len)
    ids = tok.encode(prompt, add_special_tokens=False)
    banana = tok.encode(" banana", add_special_tokens=False)[0]
    [out] = smollm_tp3.generate(prompt, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2,
                                                       logit_bias={banana: 100}), use_tqdm=False)
    with torch.no_grad():
        expected = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    got = torch.tensor([entry[t].logprob for t, entry in zip(ids[1:], out.prompt_logprobs[1:])])
    assert torch.allclose(got, expected[torch.arange(len(ids) - 1), ids[1:]], atol=1e-3)
    assert out.outputs[0].token_ids == [banana, banana]
    assert_idle(smollm_tp3)


def test_n_samples_fork_and_copy_on_write_under_tp(smollm_tp3, hf_greedy):
    # Greedy samples are all HF's continuation; they share the prompt's partial block until each writes to
    # it, which copies it on every rank (a rank that missed the copy would change the tokens).
    copies = smollm_tp3.metrics()["cow_copies_total"]
    [out] = smollm_tp3.generate(ORACLE_PROMPTS[2], SamplingParams(n=3, temperature=0, max_tokens=MAX_TOKENS),
                                use_tqdm=False)
    assert smollm_tp3.metrics()["cow_copies_total"] > copies
    want = hf_tokens(smollm_tp3, hf_greedy, ORACLE_PROMPTS[2:3])[0]
    assert [o.token_ids for o in out.outputs] == [want] * 3
    assert_idle(smollm_tp3)


def test_a_lab_sandbox_cannot_share_a_tensor_parallel_engines_weights(smollm_tp3):
    # Its forwards would run on rank 0's shard alone: the other ranks follow only the engine's own steps.
    with pytest.raises(ValueError, match="cannot share a tensor-parallel engine's weights"):
        LabSession(LabConfig(), shared=smollm_tp3.llm_engine)


def test_preemption_and_chunked_prefill_under_tp(hf_greedy):
    # 24 blocks cannot hold eight prompts and their outputs at once, and a budget of 64 tokens cuts the long
    # prompts into chunks: sequences are preempted, recomputed and still give HF's tokens.
    with LLM(num_kv_blocks=24, max_model_len=384, enable_prefix_caching=False, max_num_batched_tokens=64,
             max_num_seqs=8, tensor_parallel_size=3) as llm:
        assert greedy_tokens(llm, ORACLE_PROMPTS) == hf_tokens(llm, hf_greedy, ORACLE_PROMPTS)
        assert llm.metrics()["num_preemptions_total"] > 0
        assert_idle(llm)
        pids = llm.llm_engine.runner.ranks.pids
    assert_gone(pids)


# --- tiny random models, TP=2 -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny random Llama with an untied LM head, and its HF model."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    return folder, save_tiny(folder, LlamaForCausalLM, LlamaConfig(**SHAPE, tie_word_embeddings=False))


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    """A tiny random Qwen2 (q/k/v biases, tied table) whose odd vocabulary leaves the last shard padded."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    config = Qwen2Config(**{**SHAPE, "vocab_size": SHAPE["vocab_size"] + 1}, tie_word_embeddings=True)
    return folder, save_tiny(folder, Qwen2ForCausalLM, config)


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen2"])
def test_tiny_models_tp2_equal_tp1_and_hf(model, request):
    folder, hf = request.getfixturevalue(model)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in ([9906, 1070], [504, 2365, 6354, 16438, 18045, 690], [42])]
    with LLM(model=str(folder), num_kv_blocks=64, max_model_len=256) as one:
        want = greedy_tokens(one, prompts, params)
    with LLM(model=str(folder), num_kv_blocks=64, max_model_len=256, tensor_parallel_size=2) as two:
        assert greedy_tokens(two, prompts, params) == want
        assert_idle(two)
    for prompt, tokens in zip(prompts, want):
        ids = torch.tensor([prompt["prompt_token_ids"]])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                              do_sample=False)[0, ids.shape[1]:].tolist()
        assert tokens == ref


def test_int4_quantized_at_load_under_tp_equals_tp1(tiny_llama):
    # Group-wise int4 over the inputs: a row-parallel rank's columns are whole groups, so each shard's codes
    # are exactly TP=1's.
    folder, _ = tiny_llama
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [{"prompt_token_ids": [9906, 1070, 504, 2365]}]
    with LLM(model=str(folder), num_kv_blocks=64, max_model_len=256, quantization="int4", dtype="float32") as one:
        want = greedy_tokens(one, prompts, params)
    with LLM(model=str(folder), num_kv_blocks=64, max_model_len=256, quantization="int4", dtype="float32",
             tensor_parallel_size=2) as two:
        assert greedy_tokens(two, prompts, params) == want
        assert two.metrics()["quantization"] == "int4"


def test_the_benchmark_measures_step_time_and_collectives(tiny_llama, capsys):
    tensor_parallel_bench.main(["--model", str(tiny_llama[0]), "--tp", "1,2", "--batch", "2", "--prompt-len", "8",
                                "--steps", "3", "--json"])
    one, two = json.loads(capsys.readouterr().out)["results"]
    assert (one["tensor_parallel_size"], two["tensor_parallel_size"]) == (1, 2)
    assert one["comm_ms"] == 0 < two["comm_ms"] < two["step_ms"]
    assert two["kv_pool_bytes_per_rank"] * 2 == one["kv_pool_bytes_per_rank"]  # same blocks, half the heads each


# --- faults -------------------------------------------------------------------------------------------

LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
PROMPTS = [[9906, 1070], [504, 2365, 6354], [42], [16438, 18045, 690, 11]]


def drain(stream, within_s: float) -> list:
    deadline = time.monotonic() + within_s
    deltas = []
    while (delta := stream.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
        deltas.append(delta)
    return deltas


def test_a_rank_killed_mid_generation_fails_every_stream_within_seconds(tiny_llama):
    engine = StreamingEngine(model=str(tiny_llama[0]), num_kv_blocks=64, max_model_len=512, tensor_parallel_size=2)
    engine.start()
    try:
        streams = [engine.add_request(ids, LONG) for ids in PROMPTS]
        assert streams[0].get(timeout=60) is not None  # generating
        pids = engine.engine.runner.ranks.pids
        os.kill(pids[0], signal.SIGKILL)
        for stream in streams:
            deltas = drain(stream, within_s=10)
            assert deltas[-1].finished and deltas[-1].finish_reason == "error"
            assert "tensor-parallel rank 1" in stream.error and "exited with code -9" in stream.error
        health = engine.health()
        assert not health.alive and "RankFailedError: tensor-parallel rank 1" in health.error
        with pytest.raises(EngineDeadError, match="rank 1"):
            engine.add_request("Hi", SamplingParams(max_tokens=4))
        assert_gone(pids)
        engine.engine.check_integrity()
        assert all(b.ref_count == 0 for b in engine.engine.block_manager.pool.blocks)
    finally:
        engine.shutdown()


def test_the_ranks_exit_when_the_engine_process_is_killed(tiny_llama):
    code = ("import sys, time\nfrom inference import LLM\n"
            f"llm = LLM(model={str(tiny_llama[0])!r}, num_kv_blocks=64, max_model_len=256, tensor_parallel_size=2)\n"
            "print(*llm.llm_engine.runner.ranks.pids, flush=True)\ntime.sleep(120)\n")
    engine = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    hung = threading.Timer(60, engine.kill)  # a start that hangs ends the readline below (and fails the test)
    hung.start()
    try:
        pids = [int(pid) for pid in engine.stdout.readline().split()]
        assert len(pids) == 1 and _running(pids[0])
    finally:
        hung.cancel()
        engine.kill()
        engine.wait()
    deadline = time.monotonic() + 10
    while _running(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pids[0])  # its connections to rank 0 closed, so it left its wait for the next step


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's reaper may be slow, or absent in a container)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_llm_generate_raises_when_a_rank_dies_and_frees_everything(tiny_llama):
    llm = LLM(model=str(tiny_llama[0]), num_kv_blocks=64, max_model_len=512, tensor_parallel_size=2)
    pids = llm.llm_engine.runner.ranks.pids
    started = time.monotonic()
    threading.Timer(1.0, os.kill, (pids[0], signal.SIGKILL)).start()  # mid-generation: it takes seconds
    with pytest.raises(RankFailedError, match="tensor-parallel rank 1 .* exited with code -9"):
        llm.generate([{"prompt_token_ids": ids} for ids in PROMPTS], LONG, use_tqdm=False)
    assert time.monotonic() - started < 10
    assert_gone(pids)
    assert_idle(llm)
    with pytest.raises(RankFailedError, match="rank 1"):
        llm.generate("Hi", GREEDY, use_tqdm=False)
    llm.close()
    assert_idle(llm)


def test_the_seeds_example_3_runs_as_a_plain_script_without_a_main_guard(tmp_path):
    """vLLM's example 3 builds `LLM(..., tensor_parallel_size=4)` at a script's top level. The ranks are fresh
    interpreters that never import the script (ranks.RankProcess), so it runs as written and equals TP=1."""
    folder = tmp_path / "tiny-llama-4kv"
    save_tiny(folder, LlamaForCausalLM, LlamaConfig(**{**SHAPE, "num_key_value_heads": 4}))
    script = tmp_path / "example3.py"
    script.write_text(
        "import json\nfrom inference import LLM, SamplingParams\n"
        f"llm = LLM(model={str(folder)!r}, tensor_parallel_size=4, num_kv_blocks=64, max_model_len=256)\n"
        f"outputs = llm.generate({ORACLE_PROMPTS!r}, SamplingParams(temperature=0, max_tokens={MAX_TOKENS}))\n"
        "print(json.dumps([o.outputs[0].token_ids for o in outputs]))\n")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr[-3000:]
    with LLM(model=str(folder), num_kv_blocks=64, max_model_len=256) as tp1:
        assert json.loads(run.stdout.splitlines()[-1]) == greedy_tokens(tp1, ORACLE_PROMPTS)
