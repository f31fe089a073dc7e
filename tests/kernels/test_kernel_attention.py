"""Paged decode and prefill attention: Triton (interpreted on CPU) and the C++ CPU kernels vs the torch reference
vs float64 dense."""

from __future__ import annotations

import dataclasses
import itertools
from types import ModuleType

import pytest
import torch

from kernel_cases import PagedCase, assert_close_to, build_case, dense_attention, poisoned_like
from kernels import cpu_kernels, reference

HEADS = {1: (2, 2), 3: (6, 2), 8: (8, 1)}  # GQA ratio -> (query heads, kv heads)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# (block_size, gqa ratio, head_dim, dtype): the default run covers every value once; the sweep crosses them.
FAST = [(16, 3, 64, "fp32"), (8, 1, 128, "fp16"), (32, 8, 64, "bf16")]
SWEEP = [c for c in itertools.product([8, 16, 32], [1, 3, 8], [64, 128], DTYPES) if c not in FAST]
MATRIX = [pytest.param(*c, id="-".join(map(str, c))) for c in FAST] + [
    pytest.param(*c, id="-".join(map(str, c)), marks=pytest.mark.slow) for c in SWEEP]


@pytest.fixture(params=["triton", "cpu"])
def ops(request, device) -> ModuleType:
    """Each fast backend in turn: Triton, and the C++ CPU kernels (on CPU tensors only)."""
    return backend_module(request, device, request.param)


def backend_module(request, device: torch.device, name: str) -> ModuleType:
    """The module for backend ``name`` ("torch", "triton" or "cpu") on this run's device, or a skip saying why."""
    if name == "torch":
        return reference
    if name == "triton":
        return request.getfixturevalue("triton_ops")
    if device.type != "cpu":
        pytest.skip("the cpu backend takes CPU tensors; this run's tensors are on CUDA")
    if not cpu_kernels.available():
        reason = cpu_kernels.unavailable_reason()
        if reason.startswith("no C++ compiler"):
            pytest.skip(reason)
        pytest.fail(reason)
    return cpu_kernels


def context_lengths(block_size: int) -> list[int]:
    """1, block-1, block, block+1 and several blocks: every way a context can end inside its last block."""
    return [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 5]


def make_case(block_size: int, ratio: int, head_dim: int, dtype: str, query_lens: list[int] | None,
              device: torch.device, context_lens: list[int] | None = None) -> PagedCase:
    num_heads, kv_heads = HEADS[ratio]
    contexts = context_lens or context_lengths(block_size)
    return build_case(block_size=block_size, num_heads=num_heads, kv_heads=kv_heads, head_dim=head_dim,
                      dtype=DTYPES[dtype], context_lens=contexts, query_lens=query_lens or [1] * len(contexts),
                      seed=block_size * 1000 + ratio * 100 + head_dim + len(dtype), device=device)


def run_decode(ops: ModuleType, case: PagedCase, window: int | None = None,
               softcap: float | None = None) -> torch.Tensor:
    out = poisoned_like(case.query)
    result = ops.paged_attention_decode(case.query, case.key_cache, case.value_cache, case.block_tables,
                                        case.context_lens, case.scale, out=out, window=window, softcap=softcap)
    assert result is out
    return out


def run_prefill(ops: ModuleType, case: PagedCase, window: int | None = None,
                softcap: float | None = None) -> torch.Tensor:
    out = poisoned_like(case.query)
    result = ops.paged_attention_prefill(case.query, case.key_cache, case.value_cache, case.block_tables,
                                         case.context_lens, case.query_start_loc, case.scale, out=out,
                                         window=window, softcap=softcap)
    assert result is out
    return out


def check_both(case: PagedCase, kernel_out: torch.Tensor, reference_out: torch.Tensor,
               window: int | None = None, softcap: float | None = None) -> None:
    dtype = case.query.dtype
    expected = dense_attention(case, window, softcap)
    assert_close_to(reference_out, expected, dtype)
    assert_close_to(kernel_out, expected, dtype)
    assert_close_to(kernel_out, reference_out, dtype)


@pytest.mark.parametrize(("block_size", "ratio", "head_dim", "dtype"), MATRIX)
def test_decode_matches_reference_and_dense(ops, device, block_size, ratio, head_dim, dtype):
    # A padded batch row with nothing cached yet must come out as zeros, not NaN.
    case = make_case(block_size, ratio, head_dim, dtype, None, device, [0] + context_lengths(block_size))
    check_both(case, run_decode(ops, case), run_decode(reference, case))


@pytest.mark.parametrize(("block_size", "ratio", "head_dim", "dtype"), MATRIX)
def test_prefill_matches_reference_and_dense(ops, device, block_size, ratio, head_dim, dtype):
    # Per sequence: a decode step, a whole prompt, an extend after a prefix-cache hit, a prompt one past a
    # block, a chunk after an earlier chunk (long enough to span several query tiles), and one with no new
    # tokens this step.
    contexts = context_lengths(block_size) + [5]
    query_lens = [1, block_size - 1, 3, block_size + 1, 2 * block_size + 3, 0]
    case = make_case(block_size, ratio, head_dim, dtype, query_lens, device, contexts)
    check_both(case, run_prefill(ops, case), run_prefill(reference, case))


def test_decode_split_partitions_merge(triton_ops, device, monkeypatch):
    """With 32-token partitions, sequences use 0..5 of them; the log-sum-exp merge must equal one pass."""
    monkeypatch.setattr(triton_ops, "PARTITION_SIZE", 32)
    contexts = [0, 1, 31, 32, 33, 64, 100, 150]
    case = make_case(16, 3, 64, "fp32", None, device, contexts)
    check_both(case, run_decode(triton_ops, case), run_decode(reference, case))


def test_decode_long_context_default_partitions(ops, device):
    case = make_case(16, 8, 64, "fp16", None, device, [1100, 7])
    check_both(case, run_decode(ops, case), run_decode(reference, case))


def test_head_dim_that_is_not_a_power_of_two(ops, device):
    """head_dim 80 is padded to 128 inside the kernels; the padding must not leak into scores or outputs."""
    decode = make_case(16, 3, 80, "fp32", None, device)
    check_both(decode, run_decode(ops, decode), run_decode(reference, decode))
    prefill = make_case(16, 3, 80, "fp32", [1, 15, 16, 9, 30], device)
    check_both(prefill, run_prefill(ops, prefill), run_prefill(reference, prefill))


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_decode_over_blocks_shared_between_sequences(ops, device, dtype):
    """Sequences whose tables share their first blocks (a prefix-cache hit, parallel samples): the CPU kernel
    reads a shared block in place where it copies a private one (bfloat16), so the batch must come out bit-equal
    to the same batch with every sequence holding private copies of those blocks, and match the oracle."""
    block_size, shared_blocks = 16, 2
    private = make_case(block_size, 3, 64, dtype, None, device, [3 * block_size + 5 + s for s in range(12)])
    tables = private.block_tables.clone()
    first = tables[0, :shared_blocks].long()
    prefix = shared_blocks * block_size
    for seq in range(1, tables.shape[0]):  # the private copies hold the first sequence's prefix
        own = tables[seq, :shared_blocks].long()
        private.key_cache[own] = private.key_cache[first]
        private.value_cache[own] = private.value_cache[first]
        private.keys[seq][:prefix] = private.keys[0][:prefix]
        private.values[seq][:prefix] = private.values[0][:prefix]
    tables[1:, :shared_blocks] = tables[0, :shared_blocks]
    shared = dataclasses.replace(private, block_tables=tables)
    out = run_decode(ops, shared)
    assert torch.equal(out, run_decode(ops, private))
    check_both(shared, out, run_decode(reference, shared))


def test_prefill_single_token_rows_equal_decode(ops, device):
    """q_len 1 everywhere: the prefill kernel must agree with the decode kernel on the same batch."""
    case = make_case(16, 3, 64, "fp32", None, device)
    assert_close_to(run_prefill(ops, case), run_decode(ops, case), torch.float32)


@pytest.mark.parametrize("backend", ["triton", "cpu", "torch"])
def test_strided_query_view(request, device, backend):
    """The engine hands in query as a view of a fused QKV projection; strides must be honoured."""
    ops = backend_module(request, device, backend)
    case = make_case(8, 3, 64, "fp32", [1, 7, 1, 9, 20], device)
    tokens, heads, dim = case.query.shape
    fused = torch.randn(tokens, heads * dim + 2 * dim, dtype=case.query.dtype, device=device)
    fused[:, :heads * dim] = case.query.reshape(tokens, -1)
    case.query = fused[:, :heads * dim].view(tokens, heads, dim)
    assert not case.query.is_contiguous()
    assert_close_to(run_prefill(ops, case), dense_attention(case), torch.float32)


@pytest.mark.parametrize("backend", ["triton", "cpu", "torch"])
def test_bad_shapes_are_rejected(request, device, backend):
    ops = backend_module(request, device, backend)
    case = make_case(8, 3, 64, "fp32", None, device)
    with pytest.raises(ValueError, match="query"):
        ops.paged_attention_decode(case.query[:, :5], case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, case.scale)
    with pytest.raises(ValueError, match="context_lens"):
        ops.paged_attention_decode(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens[:-1], case.scale)
    with pytest.raises(ValueError, match="query_start_loc"):
        ops.paged_attention_prefill(case.query, case.key_cache, case.value_cache, case.block_tables,
                                    case.context_lens, case.query_start_loc[:-1], case.scale)
    with pytest.raises(ValueError, match="out"):
        ops.paged_attention_decode(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, case.scale, out=case.query[:2])


@pytest.mark.parametrize("backend", ["triton", "cpu", "torch"])
def test_empty_batch_gives_empty_output(request, device, backend):
    ops = backend_module(request, device, backend)
    cache = torch.zeros(2, 8, 1, 64, device=device)
    query = torch.zeros(0, 2, 64, device=device)
    tables = torch.zeros(0, 3, dtype=torch.int32, device=device)
    lens = torch.zeros(0, dtype=torch.int32, device=device)
    starts = torch.zeros(1, dtype=torch.int32, device=device)
    assert ops.paged_attention_decode(query, cache, cache, tables, lens, 0.125).shape == (0, 2, 64)
    assert ops.paged_attention_prefill(query, cache, cache, tables, lens, starts, 0.125).shape == (0, 2, 64)


def test_cpu_kernels_refuse_a_block_table_too_narrow_for_its_context(request, device):
    """The C++ planner checks what it would otherwise read out of bounds: a context past the table's width."""
    ops = backend_module(request, device, "cpu")
    case = make_case(8, 3, 64, "fp32", None, device, [5, 20])
    narrow = case.block_tables[:, :2]  # 20 tokens need 3 blocks of 8
    with pytest.raises(ValueError, match="block_tables has 2 columns but a context of 20 tokens needs 3 blocks"):
        ops.paged_attention_decode(case.query, case.key_cache, case.value_cache, narrow, case.context_lens,
                                   case.scale)
    # A prompt long enough for the matmul path is refused the same way.
    prompt = make_case(8, 3, 64, "fp32", [5, 40], device, [5, 40])
    with pytest.raises(ValueError, match="block_tables has 2 columns but a context of 40 tokens needs 5 blocks"):
        ops.paged_attention_prefill(prompt.query, prompt.key_cache, prompt.value_cache, prompt.block_tables[:, :2],
                                    prompt.context_lens, prompt.query_start_loc, prompt.scale)


@pytest.mark.parametrize("block_size", [16, 8])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cpu_prompts_through_matmuls_match_dense(request, device, dtype, block_size):
    """Sequences of >= prompt_min_query() new tokens attend through blocked matmuls (bfloat16 where AMX is granted:
    on tiles, in two passes, and with blocks of 8 rows, which the tiles do not take, torch's flash attention): a
    whole prompt, one after a prefix hit (causal from its offset), one spanning a partial last block, beside short
    ones and a decode row that stay in the C++ routine, all in one batch; and a whole prompt of several query tiles
    (flash: SDPA's own causal case, no mask)."""
    ops = backend_module(request, device, "cpu")
    long = ops.prompt_min_query()
    query_lens = [long, long + 9, 1, 3, 2 * long + 5, 4 * long + 3]
    contexts = [long, long + 9 + 70, 17, 40, 2 * long + 5 + 16, 4 * long + 3]
    case = make_case(block_size, 3, 64, dtype, query_lens, device, contexts)
    check_both(case, run_prefill(ops, case), run_prefill(reference, case))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cpu_lone_prompt_whose_last_tile_is_short_matches_dense(request, device, dtype):
    """One prompt alone, whole and after a prefix hit, whose last query tile (10 tokens: 30 rows per KV head, more
    than one AMX tile) sees the most keys but costs less than the tiles before it, so it runs after tiles that see
    fewer: on AMX tiles a thread keeps a sequence's packed values for its next item, which must not reuse fewer
    keys than it sees (reusing them gave errors of 1e13)."""
    ops = backend_module(request, device, "cpu")
    for context, q_len in [(138, 138), (138 + 40, 138)]:
        case = make_case(16, 3, 64, dtype, [q_len], device, [context])
        check_both(case, run_prefill(ops, case), run_prefill(reference, case))


def poison_passed_blocks(case: PagedCase, window: int) -> int:
    """Fill with NaN every block that lies wholly before its sequence's first new token's window (the blocks
    the block manager keeps but no query of the step may see), so a kernel that reads one fails; returns how
    many were poisoned (the cases are built to have some)."""
    block_size = case.key_cache.shape[1]
    q_lens = (case.query_start_loc[1:] - case.query_start_loc[:-1]).tolist()
    poisoned = 0
    for seq, (context, q_len) in enumerate(zip(case.context_lens.tolist(), q_lens)):
        passed = max(0, context - q_len - window + 1) // block_size
        for block in case.block_tables[seq, :passed].long().tolist():
            case.key_cache[block] = float("nan")
            case.value_cache[block] = float("nan")
        poisoned += passed
    return poisoned


@pytest.mark.parametrize("window", [1, 7, 20])
@pytest.mark.parametrize(("block_size", "ratio", "head_dim", "dtype"), MATRIX[:len(FAST)])
def test_sliding_window_matches_reference_and_dense(ops, device, block_size, ratio, head_dim, dtype, window):
    """A query at p sees keys p - window < k <= p: decode (contexts shorter and much longer than the window,
    one ending inside a block) and prefill (a whole prompt, a suffix after a prefix hit, a chunk after an
    earlier chunk, prompts long enough for the C++ matmul path, one of them in two query tiles), against the
    float64 dense oracle with a window mask; the blocks wholly before each window hold NaN, unread."""
    decode = make_case(block_size, ratio, head_dim, dtype, None, device,
                       [0] + context_lengths(block_size) + [window + 3 * block_size + 2, 130])
    assert poison_passed_blocks(decode, window)
    check_both(decode, run_decode(ops, decode, window), run_decode(reference, decode, window), window)
    contexts = [1, block_size + 1, 40 + 3 * block_size, 3 * block_size + 5, 40, 70, 33 + 50]
    query_lens = [1, block_size + 1, 3, 2 * block_size + 3, 40, 70, 33]
    prefill = make_case(block_size, ratio, head_dim, dtype, query_lens, device, contexts)
    assert poison_passed_blocks(prefill, window)
    check_both(prefill, run_prefill(ops, prefill, window), run_prefill(reference, prefill, window), window)


def test_sliding_window_decode_split_partitions(triton_ops, device, monkeypatch):
    """With 32-token partitions, a window leaves the first partitions of a long context empty: the merge must
    give them no weight."""
    monkeypatch.setattr(triton_ops, "PARTITION_SIZE", 32)
    case = make_case(16, 3, 64, "fp32", None, device, [1, 31, 33, 100, 150])
    assert poison_passed_blocks(case, 20)
    check_both(case, run_decode(triton_ops, case, 20), run_decode(reference, case, 20), 20)


@pytest.mark.parametrize("backend", ["triton", "cpu", "torch"])
def test_window_at_least_the_context_equals_full_attention(request, device, backend):
    """A window no query can cross changes nothing: bit-equal to full attention on the same backend."""
    ops = backend_module(request, device, backend)
    prefill = make_case(16, 3, 64, "fp32", [1, 15, 16, 9, 40], device, [1, 15, 16, 17, 53])
    assert torch.equal(run_prefill(ops, prefill, 53), run_prefill(ops, prefill))
    decode = make_case(16, 3, 64, "fp32", None, device, [1, 15, 16, 17, 53])
    assert torch.equal(run_decode(ops, decode, 53), run_decode(ops, decode))


@pytest.mark.parametrize("backend", ["triton", "cpu", "torch"])
@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_a_bad_window_is_refused(request, device, backend, window):
    ops = backend_module(request, device, backend)
    case = make_case(8, 3, 64, "fp32", None, device)
    with pytest.raises(ValueError, match="window"):
        run_decode(ops, case, window)
    with pytest.raises(ValueError, match="window"):
        run_prefill(ops, case, window)


def sharpen(case: PagedCase, factor: float) -> PagedCase:
    """The case with its queries scaled up, so scores reach well past a small soft cap (the random cases'
    scores are mostly below 1, where tanh barely bends)."""
    return dataclasses.replace(case, query=case.query * factor)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize(("block_size", "ratio", "head_dim", "dtype"), MATRIX[:len(FAST)])
def test_soft_capping_matches_reference_and_dense(ops, device, block_size, ratio, head_dim, dtype, window):
    """Gemma 2's attention-logit soft cap (``softcap * tanh(scaled score / softcap)`` before the mask and the
    softmax), with and without a window: decode, and prefill through the row-by-row path and the C++ matmul
    path (prompts of 40 and 70 new tokens), against the float64 dense oracle; the cap must change the output
    (a kernel ignoring it fails)."""
    cap = 2.0
    decode = sharpen(make_case(block_size, ratio, head_dim, dtype, None, device,
                               [0] + context_lengths(block_size) + [130]), 8.0)
    check_both(decode, run_decode(ops, decode, window, cap), run_decode(reference, decode, window, cap), window,
               cap)
    contexts = [1, block_size + 1, 40 + 3 * block_size, 3 * block_size + 5, 40, 70]
    query_lens = [1, block_size + 1, 3, 2 * block_size + 3, 40, 70]
    prefill = sharpen(make_case(block_size, ratio, head_dim, dtype, query_lens, device, contexts), 8.0)
    capped = run_prefill(ops, prefill, window, cap)
    check_both(prefill, capped, run_prefill(reference, prefill, window, cap), window, cap)
    assert not torch.allclose(capped.double(), dense_attention(prefill, window), atol=0.05)


@pytest.mark.parametrize("backend", ["triton", "cpu", "torch"])
@pytest.mark.parametrize("softcap", [0, -1.0, True, "50"])
def test_a_bad_softcap_is_refused(request, device, backend, softcap):
    ops = backend_module(request, device, backend)
    case = make_case(8, 3, 64, "fp32", None, device)
    with pytest.raises(ValueError, match="softcap"):
        run_decode(ops, case, softcap=softcap)
    with pytest.raises(ValueError, match="softcap"):
        run_prefill(ops, case, softcap=softcap)
