"""Each model family's greedy output equals HF transformers' token for token (float32): a seeded random tiny
model built from the family's own transformers config, on the C++ CPU backend and the torch reference, with
prefix caching on (the prompts run twice, the second time from cached blocks) and chunked prefill, and with
prefix caching off under preemption. RoPE scaling starts at a small `original_max_position_embeddings`, and
sliding windows are 17 to 24 tokens, so prompt plus output cross them.

OLMo 2 (norms on each sub-layer's output, q/k norm over the whole projections) and SmolLM3 (a NoPE layer) run
layer by layer on the C++ backend; Phi-3 (fused checkpoint tensors, partial rotary, LongRoPE) runs the one-call
C++ decoder stack. LongRoPE is tested on both sides of inference/rope.py's condition for HF equality:
max_model_len (256) <= original_max_position_embeddings (the short factors throughout), and every prompt
longer than original_max_position_embeddings (the long factors throughout).
"""

import pytest
import torch
from transformers import (
    AutoTokenizer, DeepseekV2Config, DeepseekV2ForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM,
    Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
    MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Olmo2Config, Olmo2ForCausalLM, Phi3Config,
    Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
    Qwen3MoeForCausalLM, SmolLM3Config, SmolLM3ForCausalLM,
)

import kernels.cpu_kernels
from inference import LLM, SamplingParams
from tests.inference.engines import assert_idle
from tests.inference.oracle_prompts import ORACLE_PROMPTS
from tests.inference.tiny_models import SHAPE, save_tiny

MAX_TOKENS = 64
TRITON_TOKENS = TP_TOKENS = 16  # fewer than the others: the interpreter is slow, rank processes start slowly
PROMPTS = [ORACLE_PROMPTS[i] for i in (1, 4, 6, 7)]  # 5 to ~150 tokens
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
FAMILY_SHAPE = {**SHAPE, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
# Phi-3's config derives head_dim from hidden_size (its rope checks do too): 4 heads of 32, 24 of them rotated.
PHI3_SHAPE = {**SHAPE, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}


# The slow backends run one family per path of their own, not all of them: the model code every family adds runs
# on the torch and C++ backends above, token for token against HF. Triton: its attention kernels at head_dim 64
# (llama3) and 32 (Phi-3), reading the latent (DeepSeek-V2), and the fused-MoE kernel (Qwen3-MoE); windows and
# soft caps in `test_windowed_family_on_triton_equals_hf` (a window on every layer; windowed and full layers
# alternating with an attention cap). TP=2: how each family's weights are sharded (plain, per-head q/k norm, q/k/v
# biases, fused Phi-3 tensors, NoPE layers, Gemma's norms and caps), and every refusal.
TRITON_FAMILIES = ["llama3", "phi3-longrope-long", "deepseek-v2-q", "qwen3-moe"]
WINDOWED_TRITON_FAMILIES = ["mistral-window", "gemma2"]
TP_FAMILIES = ["llama3", "qwen3", "qwen2-layer-types", "phi3-window", "smollm3", "gemma2", "gemma3"]

# Families whose TP=2 is refused, and the words the refusal names them by.
TP_REFUSED = {"olmo2": "q/k norm over the whole projection", "qwen3-moe": "mixture of experts",
              "mixtral": "mixture of experts", "deepseek-v2": "latent attention", "deepseek-v2-q": "latent attention"}


def phi3_longrope(original: int) -> dict:
    """Phi-4-mini's RoPE (LongRoPE, partial_rotary_factor 0.75) with distinct short and long factors per pair."""
    return {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.05 * i for i in range(12)], "long_factor": [1.5 + 0.5 * i for i in range(12)],
            "original_max_position_embeddings": original}


DEEPSEEK = {**{k: v for k, v in FAMILY_SHAPE.items() if k != "head_dim"}, "num_key_value_heads": 4,
            "kv_lora_rank": 48, "q_lora_rank": None, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
            "first_k_dense_replace": 1, "routed_scaling_factor": 1.5, "tie_word_embeddings": False}

FAMILIES = {
    "llama3": (LlamaForCausalLM, LlamaConfig(**FAMILY_SHAPE, tie_word_embeddings=True, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**FAMILY_SHAPE, tie_word_embeddings=True)),
    "qwen3-yarn": (Qwen3ForCausalLM, Qwen3Config(**FAMILY_SHAPE, tie_word_embeddings=False, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 8.0, "original_max_position_embeddings": 64})),
    # Mixtures of experts (inference/moe.py): 4 experts, 2 a token; Qwen3-MoE with a dense second layer.
    "qwen3-moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**FAMILY_SHAPE, num_experts=4, num_experts_per_tok=2,
                                                       moe_intermediate_size=32, norm_topk_prob=True,
                                                       mlp_only_layers=[1], tie_word_embeddings=True)),
    "mixtral": (MixtralForCausalLM, MixtralConfig(**{**FAMILY_SHAPE, "intermediate_size": 32}, num_local_experts=4,
                                                  num_experts_per_tok=2, sliding_window=None)),
    # Latent attention (inference/mla.py) with DeepSeek's experts: a dense first layer, then 4 routed experts
    # (2 a token, scaled) beside a shared one. "-q" adds the low-rank query and the group-limited top-k.
    "deepseek-v2": (DeepseekV2ForCausalLM, DeepseekV2Config(**DEEPSEEK)),
    "deepseek-v2-q": (DeepseekV2ForCausalLM, DeepseekV2Config(**{**DEEPSEEK, "q_lora_rank": 24},
                                                               topk_method="group_limited_greedy", n_group=2,
                                                               topk_group=1)),
    # Sliding windows: Mistral v0.1 on every layer (the one-call C++ stack); Qwen2 from max_window_layers on,
    # and alternating by layer_types as Gemma does (the per-op path: q/k/v biases).
    "mistral-window": (MistralForCausalLM, MistralConfig(**FAMILY_SHAPE, sliding_window=20)),
    "qwen2-window": (Qwen2ForCausalLM, Qwen2Config(**FAMILY_SHAPE, use_sliding_window=True, sliding_window=24,
                                                   max_window_layers=1)),
    "qwen2-layer-types": (Qwen2ForCausalLM, Qwen2Config(**FAMILY_SHAPE, use_sliding_window=True, sliding_window=17,
                                                        layer_types=["sliding_attention", "full_attention"])),
    "olmo2": (Olmo2ForCausalLM, Olmo2Config(**FAMILY_SHAPE)),
    # Every second layer applies no RoPE: layer 1 of 2.
    "smollm3": (SmolLM3ForCausalLM, SmolLM3Config(**FAMILY_SHAPE, no_rope_layer_interval=2, pad_token_id=None)),
    # max_model_len 256 <= original 256: HF and the engine use the short factors throughout.
    "phi3-longrope-short": (Phi3ForCausalLM, Phi3Config(**PHI3_SHAPE, original_max_position_embeddings=256,
                                                        rope_parameters=phi3_longrope(256))),
    # Every prompt (5 tokens or more) is longer than original 4: HF and the engine use the long factors.
    "phi3-longrope-long": (Phi3ForCausalLM, Phi3Config(**PHI3_SHAPE, original_max_position_embeddings=4,
                                                       rope_parameters=phi3_longrope(4))),
    # Windows: Phi-3 on every layer with partial rotary (the one-call C++ stack); SmolLM3 on its NoPE layer.
    "phi3-window": (Phi3ForCausalLM, Phi3Config(**PHI3_SHAPE, sliding_window=20, partial_rotary_factor=0.75)),
    "smollm3-window": (SmolLM3ForCausalLM, SmolLM3Config(**FAMILY_SHAPE, no_rope_layer_interval=2, pad_token_id=None,
                                                         use_sliding_window=True, sliding_window=20)),
    # Gemma 2: windows on layer 0 (of 2), query_pre_attn_scalar apart from head_dim, and an attention soft cap
    # small enough to bend these scores (the token-for-token check fails without it). HF's soft cap needs its
    # eager attention.
    "gemma2": (Gemma2ForCausalLM, Gemma2Config(**FAMILY_SHAPE, sliding_window=20, query_pre_attn_scalar=48,
                                               attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                               attn_implementation="eager")),
    # Gemma 3: q/k norms, two sliding layers with their own RoPE base, then a full one with linear scaling.
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(
        **{**FAMILY_SHAPE, "num_hidden_layers": 3}, sliding_window=18, query_pre_attn_scalar=80,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0}})),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(model folder, PROMPTS as token ids, HF's greedy tokens for each)."""
    folder = tmp_path_factory.mktemp(request.param)
    model_cls, config = FAMILIES[request.param]
    hf = save_tiny(folder, model_cls, config)
    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    want = []
    for ids in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False)
        want.append(out[0, len(ids):].tolist())
    return folder, [{"prompt_token_ids": ids} for ids in prompts], want


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_family_greedy_equals_hf(family, backend):
    if backend == "cpu" and not kernels.cpu_kernels.available():
        pytest.skip(kernels.cpu_kernels.unavailable_reason())
    folder, prompts, want = family
    cached = LLM(model=str(folder), dtype="float32", attention_backend=backend, num_kv_blocks=128,
                 max_model_len=256, max_num_batched_tokens=32, max_num_seqs=4)
    for _ in range(2):  # the second round reads the prompts' full blocks from the prefix cache
        assert [o.outputs[0].token_ids for o in cached.generate(prompts, GREEDY)] == want
    assert cached.metrics()["prefix_cache_hits_total"] > 0
    assert_idle(cached)
    # 16 blocks of 16 slots cannot hold four prompts and their outputs at once: sequences are preempted.
    tight = LLM(model=str(folder), dtype="float32", attention_backend=backend, num_kv_blocks=16,
                max_model_len=256, enable_prefix_caching=False)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, GREEDY)] == want
    assert tight.metrics()["num_preemptions_total"] > 0
    assert_idle(tight)


@pytest.mark.parametrize("family", ["gemma2"], indirect=True)
def test_gemma2_final_logit_soft_cap_equals_hf_in_prompt_logprobs(family):
    """The final soft cap leaves the greedy argmax as it is, so it is checked where it shows: each prompt token's
    log-probability equals HF's (its logits capped at 3, which moves these log-probabilities by far more than the
    tolerance, as the uncapped head's show)."""
    folder, prompts, _ = family
    hf = Gemma2ForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = prompts[3]["prompt_token_ids"]
    with torch.no_grad():
        hidden = hf.model(torch.tensor([ids])).last_hidden_state
        raw = hf.lm_head(hidden)[0]
        capped = hf(torch.tensor([ids])).logits[0]
    assert raw.abs().max() > 6 and capped.abs().max() <= 3
    llm = LLM(model=str(folder), dtype="float32", attention_backend="cpu" if kernels.cpu_kernels.available()
              else "torch", num_kv_blocks=32, max_model_len=256)
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    got = torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])
    positions, tokens = torch.arange(len(ids) - 1), torch.tensor(ids[1:])
    want = capped.log_softmax(-1)[positions, tokens]
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
    assert (got - raw.log_softmax(-1)[positions, tokens]).abs().max() > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("family", WINDOWED_TRITON_FAMILIES, indirect=True)
def test_windowed_family_on_triton_equals_hf(family):
    """The windowed Triton kernels in the engine (interpreted on the CPU): chunked prefill, then the same prompts
    again from the prefix cache."""
    pytest.importorskip("triton")
    folder, prompts, want = family
    llm = LLM(model=str(folder), dtype="float32", attention_backend="triton", num_kv_blocks=128,
              max_model_len=256, max_num_batched_tokens=32, max_num_seqs=4)
    assert llm.llm_engine.runner.ops.__name__ == "kernels.triton_kernels"
    for _ in range(2):
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == want
    assert llm.metrics()["prefix_cache_hits_total"] > 0
    assert_idle(llm)


@pytest.mark.slow
@pytest.mark.parametrize("family", TRITON_FAMILIES, indirect=True)
def test_family_greedy_equals_hf_on_triton(family):
    """The Triton backend (attention kernels interpreted on the CPU; rotary and norms are the reference's):
    HF's first tokens for every prompt, prefill and decode both through the kernels."""
    pytest.importorskip("triton")
    folder, prompts, want = family
    llm = LLM(model=str(folder), dtype="float32", attention_backend="triton", num_kv_blocks=32, max_model_len=256)
    assert llm.llm_engine.runner.ops.__name__ == "kernels.triton_kernels"
    params = SamplingParams(temperature=0, max_tokens=TRITON_TOKENS, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == [w[:TRITON_TOKENS] for w in want]


@pytest.mark.slow
@pytest.mark.parametrize("family", TP_FAMILIES + sorted(TP_REFUSED), indirect=True)
def test_family_under_tensor_parallelism_equals_hf(family, request):
    """TP=2 on gloo (2 of 4 query heads and 1 of 2 KV heads a rank; Phi-3's fused tensors split before they
    are sharded): HF's first tokens for every prompt. What TP does not implement is refused by name."""
    folder, prompts, want = family
    params = SamplingParams(temperature=0, max_tokens=TP_TOKENS, ignore_eos=True)
    refusal = TP_REFUSED.get(request.node.callspec.params["family"])
    if refusal is not None:
        with pytest.raises(ValueError, match=refusal):
            LLM(model=str(folder), num_kv_blocks=64, max_model_len=256, tensor_parallel_size=2)
        return
    with LLM(model=str(folder), dtype="float32", num_kv_blocks=64, max_model_len=256, tensor_parallel_size=2) as llm:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == [w[:TP_TOKENS] for w in want]
        assert_idle(llm)


@pytest.mark.parametrize("family", ["mistral-window", "qwen2-layer-types"], indirect=True)
def test_the_blocks_every_window_has_passed_are_named_for_the_memory_view(family):
    """Mistral's window (20) covers every layer: once a sequence is past it, its first blocks are never read
    again, and the engine's sequence figures say how many (the memory view dims them). A model with a
    full-attention layer (Qwen2's layer_types) reads every block: none is named."""
    folder, prompts, _ = family
    engine = LLM(model=str(folder), dtype="float32", num_kv_blocks=64, max_model_len=256).llm_engine
    engine.add_request("long", prompts[-1], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(12):
        engine.step()
    (seq,) = engine.metrics()["sequences"]
    all_windowed = None not in engine.runner.cfg.windows
    # The next query at position context_len sees keys after context_len - 20: whole blocks of 16 before that.
    want = (seq["context_len"] - 20 + 1) // 16 if all_windowed else 0
    assert seq["outside_window"] == want and (want > 0) == all_windowed
    engine.abort_request("long")
