"""The model's one-call decoder stack on the CPU (`kernels.cpu_kernels.decoder_layers`) against the same model
run layer by layer through the torch reference ops: the hidden states each step returns and every K/V row it
writes, over steps that mix whole prompts, a prompt after cached context, short suffixes and decode rows."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from inference.model import AttentionMetadata, load_model
from kernels import cpu_kernels, reference
from tests.inference.quant_checkpoints import save_folder, tiny_llama
from tests.kernels.kernel_cases import assert_close_to

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="the C++ CPU kernels cannot be built here")

BLOCK_SIZE = 16
# (cached tokens before the step, new tokens) per sequence, one list per step; each sequence's tokens continue
# the previous step's. Step 1: whole prompts, long (the matmul prompt path) and short. Step 2: a decode row, a
# 45-token suffix after 20 cached tokens (the prompt path from an offset), a 3-token suffix, a new prompt.
STEPS = [[(0, 40), (0, 20), (0, 5)], [(40, 1), (20, 45), (5, 3), (0, 33)]]


def metadata(step: list[tuple[int, int]]) -> tuple[torch.Tensor, AttentionMetadata]:
    """Positions and metadata of a step; sequence s owns blocks 8s.. (enough for 128 tokens each)."""
    positions, slots, contexts, starts = [], [], [], [0]
    for s, (cached, new) in enumerate(step):
        for p in range(cached, cached + new):
            positions.append(p)
            slots.append((8 * s + p // BLOCK_SIZE) * BLOCK_SIZE + p % BLOCK_SIZE)
        contexts.append(cached + new)
        starts.append(starts[-1] + new)
    tables = torch.tensor([[8 * s + b for b in range(8)] for s in range(len(step))], dtype=torch.int32)
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots), block_tables=tables,
                             context_lens=torch.tensor(contexts, dtype=torch.int32),
                             query_start_loc=torch.tensor(starts, dtype=torch.int32),
                             is_decode=all(new == 1 for _, new in step))
    return torch.tensor(positions), meta


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """The suite runs on one thread (tests/conftest.py); two make the kernels share prompts between threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("windows", [None, [7, None, 20]], ids=["full", "windows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_call_stack_equals_the_reference_layer_by_layer(tmp_path, dtype, threads, windows):
    """Also with a sliding window on some layers (each layer's own, as Gemma alternates them; the stack takes a
    window per layer): set on the loaded Llama, as no family's config mixes windows without a q/k/v bias."""
    hf = tiny_llama(hidden_size=192, intermediate_size=384, num_attention_heads=6, num_key_value_heads=2,
                    num_hidden_layers=3)
    model = load_model(save_folder(tmp_path, hf), torch.device("cpu"), dtype)
    if windows is not None:
        for layer, window in zip(model.layers, windows):
            layer.self_attn.window = window
        model.stack_windows = [window or 0 for window in windows]
    assert model._stack_weights(cpu_kernels) is not None, "this model must take the one-call path"
    assert model._stack_weights(reference) is None
    shape = (4 * 8, BLOCK_SIZE, 2, 32)
    caches = {ops: [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(3)]
              for ops in (cpu_kernels, reference)}
    generator = torch.Generator().manual_seed(0)
    for step in STEPS:
        positions, meta = metadata(step)
        ids = torch.randint(0, hf.config.vocab_size, positions.shape, generator=generator)
        fused = model(ids, positions, caches[cpu_kernels], meta, cpu_kernels)
        expected = model(ids, positions, caches[reference], meta, reference)
        assert_close_to(fused, expected, dtype)
        # Only some rows (each sequence's last, as a step samples, and a prompt's third): the last layer runs
        # past its K/V for those alone, each row attending up to its own position.
        rows = torch.cat([meta.query_start_loc[1:] - 1, torch.tensor([2])])
        assert_close_to(model(ids, positions, caches[cpu_kernels], meta, cpu_kernels, rows=rows), expected[rows], dtype)
        assert model(ids, positions, caches[cpu_kernels], meta, cpu_kernels, rows=rows[:0]).shape == (0, 192)
    for (k, v), (k_ref, v_ref) in zip(caches[cpu_kernels], caches[reference]):
        assert_close_to(k, k_ref, dtype)
        assert_close_to(v, v_ref, dtype)


def test_layers_that_need_python_keep_the_layer_by_layer_path(tmp_path):
    """LoRA (installed after loading, so checked every step) or a bias: no one-call path."""
    model = load_model(save_folder(tmp_path, tiny_llama()), torch.device("cpu"), torch.float32)
    assert model._stack_weights(cpu_kernels) is not None
    model.layers[1].mlp.down_proj.lora = object()
    assert model._stack_weights(cpu_kernels) is None
    model.layers[1].mlp.down_proj.lora = None
    assert model._stack_weights(cpu_kernels) is not None

    hf = tiny_llama(attention_bias=True)  # q/k/v biases, as Qwen2 has them (our loader takes no o_proj bias)
    state = {k: v for k, v in hf.state_dict().items() if not k.endswith("o_proj.bias")}
    biased = load_model(save_folder(tmp_path / "bias", hf, state), torch.device("cpu"), torch.float32)
    assert biased._stack_weights(cpu_kernels) is None


def test_the_one_call_stack_runs_without_the_interpreter_lock(tmp_path, monkeypatch):
    """A worker's web server, token publisher and Celery threads share the engine's process (issue 41): while the
    C++ stack computes a step they must run. With the switch interval at an hour the interpreter changes threads
    only where one releases the lock, so the main thread runs during the call only if the call released it."""
    hf = tiny_llama(hidden_size=192, intermediate_size=384, num_attention_heads=6, num_key_value_heads=2,
                    num_hidden_layers=3)
    model = load_model(save_folder(tmp_path, hf), torch.device("cpu"), torch.float32)
    shape = (4 * 8, BLOCK_SIZE, 2, 32)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(3)]
    positions, meta = metadata(STEPS[0])
    ids = torch.randint(0, hf.config.vocab_size, positions.shape, generator=torch.Generator().manual_seed(0))
    native, calls = cpu_kernels.extension(), []

    class Recorder:  # the exact arguments the model hands the C++ routine
        def decoder_layers(self, *args):
            calls.append(args)
            return native.decoder_layers(*args)

    monkeypatch.setattr(cpu_kernels, "extension", Recorder)
    model(ids, positions, caches, meta, cpu_kernels)
    (args,) = calls
    started, finished, seen_running = threading.Event(), threading.Event(), []

    def step() -> None:
        started.set()
        for _ in range(50):  # long enough for the main thread to be woken
            native.decoder_layers(*args)
        finished.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(3600)
    try:
        worker = threading.Thread(target=step)
        worker.start()
        started.wait()
        seen_running.append(not finished.is_set())
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert seen_running == [True]
