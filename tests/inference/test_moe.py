"""The mixture-of-experts MLP (inference/moe.py): each family's router and experts equal HF transformers' own
block bit for bit in float32; a step's tokens are grouped by expert (one matmul per expert some token chose,
not one per token); what is not implemented around experts is refused by name. The whole-model oracle
(greedy equals HF generate, prefix caching, chunked prefill, preemption) is in test_model_families.py."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
import torch.nn.functional as F
from transformers import DeepseekV2Config, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

import inference.moe
from inference import LLM, SamplingParams
from inference.linear import FloatWeight
from inference.model import MLP, ModelConfig
from inference.moe import MoEConfig, SparseMoE
from inference.parallel.group import Group
from kernels import moe_reference
from tests.inference.quant_checkpoints import hf_greedy, hf_with_engine_weights, pack_awq
from tests.inference.tiny_models import SHAPE, save_tiny

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 64, 32, 8, 2
SMALL = dict(num_kv_blocks=32, max_model_len=128)


def hf_block(family: str, normalize: bool = True, grouped: bool = False):
    torch.manual_seed(0)
    if family == "mixtral":
        config = MixtralConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K)
        block = MixtralSparseMoeBlock(config)
    elif family == "deepseek_v2":
        config = DeepseekV2Config(hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE, n_routed_experts=EXPERTS,
                                  num_experts_per_tok=TOP_K, n_shared_experts=2, routed_scaling_factor=1.5,
                                  **(dict(topk_method="group_limited_greedy", n_group=4, topk_group=2) if grouped
                                     else {}))
        block = DeepseekV2Moe(config)
    else:
        config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE, num_experts=EXPERTS,
                                num_experts_per_tok=TOP_K, norm_topk_prob=normalize)
        block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0, 0.2)
    return block.eval()


def ours_like(block) -> SparseMoE:
    """Our block with HF `block`'s weights and routing."""
    deepseek = isinstance(block, DeepseekV2Moe)
    router = block.gate
    moe = MoEConfig(num_experts=EXPERTS, top_k=TOP_K, intermediate_size=INTERMEDIATE,
                    normalize=getattr(router, "norm_topk_prob", True) and not deepseek, dense_layers=frozenset(),
                    router_float32=deepseek, routed_scaling_factor=getattr(router, "routed_scaling_factor", 1.0),
                    groups=(router.num_group, router.topk_group) if deepseek and router.num_group else None,
                    shared_intermediate_size=2 * INTERMEDIATE if deepseek else 0)
    shared = None
    if deepseek:
        cfg = ModelConfig(vocab_size=1, hidden_size=HIDDEN, intermediate_size=1, num_layers=1, num_heads=1,
                          num_kv_heads=1, head_dim=HIDDEN, rms_norm_eps=1e-6, max_position_embeddings=1,
                          tie_word_embeddings=False, attention_bias=False, eos_token_ids=[])
        shared = MLP(cfg, Group.single(), moe.shared_intermediate_size)
        mlp = block.shared_experts
        shared.gate_up_proj.load(FloatWeight(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()))
        shared.down_proj.load(FloatWeight(mlp.down_proj.weight.detach()))
    ours = SparseMoE(HIDDEN, moe, shared)
    gate_up, down = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    experts = [(g, u, d) for g, u, d in zip(*gate_up.chunk(2, dim=1), down)]
    ours.load(router.weight.detach(), experts, torch.float32, torch.device("cpu"))
    return ours


@pytest.mark.parametrize("family, normalize, grouped", [
    ("mixtral", True, False), ("qwen3_moe", True, False), ("qwen3_moe", False, False), ("deepseek_v2", False, False),
    ("deepseek_v2", False, True),
], ids=["mixtral", "qwen3-moe", "qwen3-moe-unnormalized", "deepseek-v2", "deepseek-v2-grouped"])
def test_the_block_equals_hfs_bit_for_bit(family, normalize, grouped):
    """Router order, renormalisation, DeepSeek's float32 router, group-limited top-k, scaling and shared
    experts: the whole block's output equals HF's own exactly."""
    block = hf_block(family, normalize, grouped)
    x = torch.randn(1, 37, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = block(x)[0]
    assert torch.equal(ours_like(block)(x[0]), want)


def test_tokens_are_grouped_by_expert_one_matmul_each(monkeypatch):
    moe = ours_like(hf_block("mixtral"))
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(2))
    active = moe.route(x)[0].unique().numel()
    calls = []

    def counting_linear(inp, weight, bias=None):
        calls.append(inp.shape[0])
        return F.linear(inp, weight, bias)

    counting = type("F", (), {"linear": staticmethod(counting_linear), "one_hot": staticmethod(F.one_hot)})
    monkeypatch.setattr(inference.moe, "F", counting)  # the router
    monkeypatch.setattr(moe_reference, "F", counting)  # the experts (the CPU backends' fused_moe)
    moe(x)
    assert calls[0] == 40  # the router, once for all tokens
    assert len(calls) == 1 + 2 * active  # gate/up and down once per expert some token chose
    assert sum(calls[1::2]) == 40 * TOP_K  # every (token, pick) pair computed exactly once


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral")
    save_tiny(folder, MixtralForCausalLM, MixtralConfig(**{**SHAPE, "intermediate_size": 32}, num_local_experts=4,
                                                        num_experts_per_tok=2, sliding_window=None))
    return folder


def test_packed_int4_experts_are_refused_by_name(tmp_path, tiny_mixtral):
    """An AWQ checkpoint of an MoE (its experts packed as AutoAWQ does): the experts' packed codes are not read."""
    for name in tiny_mixtral.iterdir():
        (tmp_path / name.name).write_bytes(name.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                                     "version": "gemm"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = {}
    for name, value in load_file(tmp_path / "model.safetensors").items():
        if name.endswith("_proj.weight") or ".experts." in name:  # the linear layers; not the router
            state.update({f"{name.removesuffix('.weight')}.{k}": t for k, t in pack_awq(value, 32).items()})
        else:
            state[name] = value
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="quantization='awq' of a mixture of experts is not implemented"):
        LLM(model=str(tmp_path), **SMALL)


@pytest.mark.parametrize("kwargs, message", [
    (dict(enable_lora=True), "enable_lora does not support a mixture of experts"),
    (dict(tensor_parallel_size=2), "tensor_parallel_size>1 does not support a mixture of experts"),
], ids=["lora", "tp"])
def test_what_experts_do_not_support_is_refused_by_name(tiny_mixtral, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=str(tiny_mixtral), **SMALL, **kwargs)


def test_expert_fields_in_a_dense_family_are_refused(tmp_path, tiny_mixtral):
    config = json.loads((tiny_mixtral / "config.json").read_text())
    config["model_type"] = "mistral"  # a Mixtral config relabelled: its experts would be silently dropped
    for name in tiny_mixtral.iterdir():
        (tmp_path / name.name).write_bytes(name.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="num_experts_per_tok, num_local_experts: a mixture of experts is not part"):
        LLM(model=str(tmp_path), **SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("model_cls, config", [
    (Qwen3MoeForCausalLM, Qwen3MoeConfig(**SHAPE, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                         head_dim=16, norm_topk_prob=True)),
    (MixtralForCausalLM, MixtralConfig(**{**SHAPE, "intermediate_size": 32}, num_local_experts=4,
                                       num_experts_per_tok=2, sliding_window=None)),
], ids=["qwen3-moe", "mixtral"])
def test_quantized_experts_match_hf_on_the_same_weights(tmp_path, model_cls, config, method):
    """quantization="int8" / "int4" quantizes every expert (per output row / per group of 32 inputs; router
    float): greedy output equals HF's on a model holding the de-quantized values, and the experts really are
    quantized (a float path would pass the greedy check too)."""
    model = save_tiny(tmp_path, model_cls, config)
    llm = LLM(model=str(tmp_path), quantization=method, dtype="float32", **SMALL)
    moe = llm.llm_engine.runner.model.layers[1].mlp
    codes = {"int8": torch.int8, "int4": torch.uint8}[method]
    assert moe.gate_up.dtype == moe.down.dtype == codes and moe.gate.dtype == torch.float32
    float_gate_up = model.model.layers[1].mlp.experts.gate_up_proj.detach()
    assert not torch.equal(moe.expert_weights()[0], float_gate_up)  # rounded to the format's levels
    torch.testing.assert_close(moe.expert_weights()[0], float_gate_up, rtol=0, atol=0.01 if method == "int8" else 0.1)
    hf = hf_with_engine_weights(llm, model.config)
    tok = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for prompt in ["Hello there", "The quick brown fox jumps over"]:
        ids = tok.encode(prompt, add_special_tokens=False)
        [out] = llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)
        assert out.outputs[0].token_ids == hf_greedy(hf, ids, 12), prompt


@pytest.mark.slow
@pytest.mark.parametrize("quantization", [None, "int4"], ids=["float", "int4"])
def test_triton_backend_serves_experts_with_the_fused_kernel(tiny_mixtral, quantization, monkeypatch):
    """The whole engine on the triton backend (interpreted here): the MoE layers run the fused-MoE kernel and
    greedy tokens equal the torch backend's (whose experts are the grouped reference)."""
    pytest.importorskip("triton")
    from kernels import moe_triton

    original, calls = moe_triton.fused_moe, []
    monkeypatch.setattr(moe_triton, "fused_moe", lambda *args: calls.append(args[1].dtype) or original(*args))
    prompts = [{"prompt_token_ids": [5, 17, 300, 2]}, {"prompt_token_ids": [9, 8, 7, 6, 5, 4, 3]}]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(model=str(tiny_mixtral), attention_backend=backend, quantization=quantization, dtype="float32",
                  **SMALL)
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert bool(calls) == (backend == "triton")  # the kernel serves the triton backend only
    assert set(calls) == {torch.uint8 if quantization else torch.float32}
    assert outs["triton"] == outs["torch"]
