"""The mixture-of-experts MLP (inference/moe.py): each family's router and experts equal HF transformers' own
block bit for bit in float32; a step's tokens are grouped by expert (one matmul per expert some token chose,
not one per token); what is not implemented around experts is refused by name. The whole-model oracle
(greedy equals HF generate, prefix caching, chunked prefill, preemption) is in test_model_families.py."""

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import MixtralConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

import inference.moe
from inference import LLM
from inference.moe import SparseMoE
from tests.inference.tiny_models import SHAPE, save_tiny

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 64, 32, 8, 2
SMALL = dict(num_kv_blocks=32, max_model_len=128)


def hf_block(family: str, normalize: bool = True):
    torch.manual_seed(0)
    if family == "mixtral":
        config = MixtralConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K)
        block = MixtralSparseMoeBlock(config)
    else:
        config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE, num_experts=EXPERTS,
                                num_experts_per_tok=TOP_K, norm_topk_prob=normalize)
        block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0, 0.2)
    return block.eval()


def ours_like(block) -> SparseMoE:
    normalize = getattr(block.gate, "norm_topk_prob", True)
    moe = SparseMoE(HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, normalize)
    gate_up, down = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    experts = [(g, u, d) for g, u, d in zip(*gate_up.chunk(2, dim=1), down)]
    moe.load(block.gate.weight.detach(), experts, torch.float32, torch.device("cpu"))
    return moe


@pytest.mark.parametrize("family, normalize", [("mixtral", True), ("qwen3_moe", True), ("qwen3_moe", False)])
def test_the_block_equals_hfs_bit_for_bit(family, normalize):
    block = hf_block(family, normalize)
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

    monkeypatch.setattr(inference.moe, "F", type("F", (), {"linear": staticmethod(counting_linear),
                                                          "one_hot": staticmethod(F.one_hot)}))
    moe(x)
    assert calls[0] == 40  # the router, once for all tokens
    assert len(calls) == 1 + 2 * active  # gate/up and down once per expert some token chose
    assert sum(calls[1::2]) == 40 * TOP_K  # every (token, pick) pair computed exactly once


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral")
    from transformers import MixtralForCausalLM

    save_tiny(folder, MixtralForCausalLM, MixtralConfig(**{**SHAPE, "intermediate_size": 32}, num_local_experts=4,
                                                        num_experts_per_tok=2, sliding_window=None))
    return folder


@pytest.mark.parametrize("kwargs, message", [
    (dict(quantization="int8"), "quantization='int8' of a mixture of experts is not implemented"),
    (dict(enable_lora=True), "enable_lora does not support a mixture of experts"),
    (dict(tensor_parallel_size=2), "tensor_parallel_size>1 does not support a mixture of experts"),
], ids=["quantized", "lora", "tp"])
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
