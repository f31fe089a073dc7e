"""LoRA adapters over the real stack: the embedded playground serving SmolLM2 with PLAYGROUND_LORA_MODULES (a
real PEFT adapter, and a corrupt one), through the official `openai` client. The adapter's greedy reply equals
the engine's own under the same adapter; an unknown name is a 404; the corrupt adapter a 400, after which the
worker keeps serving and holds no block."""
import copy

import openai
import pytest
import torch
from api_server import MODEL, reference_llm, start

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from inference.model_loader import resolve_model

    root = tmp_path_factory.mktemp("adapters")
    base = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL), dtype=torch.float32)
    torch.manual_seed(5)
    config = LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    get_peft_model(copy.deepcopy(base), config).save_pretrained(root / "colours")
    (root / "broken").mkdir()
    (root / "broken" / "adapter_config.json").write_bytes((root / "colours" / "adapter_config.json").read_bytes())
    (root / "broken" / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, adapters):
    modules = f"colours={adapters / 'colours'},broken={adapters / 'broken'}"
    live = start(tmp_path_factory.mktemp("api-lora"), {"PLAYGROUND_LORA_MODULES": modules,
                                                       "ENGINE_MAX_LORA_RANK": "8"})
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api_base, api_key=server.api_key("alice"), max_retries=0, timeout=300)


def test_adapters_are_listed_selected_and_bad_ones_refused(client, server, adapters):
    from inference import LoRARequest, SamplingParams

    assert [(m.id, getattr(m, "parent", None)) for m in client.models.list().data] == [
        (MODEL, None), ("colours", MODEL), ("broken", MODEL)]

    llm = reference_llm(enable_lora=True, max_lora_rank=8)
    params = SamplingParams(temperature=0, max_tokens=12)
    want = llm.chat([CHAT], params, use_tqdm=False, lora_request=LoRARequest("colours", 1, str(adapters / "colours")))
    base = llm.chat([CHAT], params, use_tqdm=False)
    assert want[0].outputs[0].text != base[0].outputs[0].text  # the adapter changes the reply

    def ask(model):
        reply = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=12)
        return reply.choices[0].message.content

    assert ask("colours") == want[0].outputs[0].text
    assert ask(MODEL) == base[0].outputs[0].text
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        ask("nope")
    with pytest.raises(openai.BadRequestError, match="adapter_model.safetensors is corrupt"):
        ask("broken")
    assert ask("colours") == want[0].outputs[0].text  # the worker keeps serving
    server.wait_idle()
