"""Compile every Triton kernel to a Hopper (sm_90) cubin on a machine without a GPU.

The interpreter runs kernels as numpy code and skips the compiler's own rules (what may sit inside a loop,
where a kernel may return, dot shapes, shared-memory limits), so a kernel can pass every interpreted test and
still fail to compile. Triton ships ptxas, so compiling for a GPU target needs no GPU. Run as a script with
TRITON_INTERPRET unset or 0: ``python tests/kernels/compile_for_hopper.py fp16 bf16``.
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import triton_kernels as tk

HOPPER = GPUTarget("cuda", 90, 32)
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# (query heads, kv heads, head_dim, block_size): SmolLM2-135M and a Llama-3-8B-like shape.
MODEL_SHAPES = [(9, 3, 64, 16), (32, 8, 128, 16)]


def compile_kernel(kernel, pointers: dict[str, str], constexprs: dict) -> None:
    """Compile ``kernel`` with the given pointer element types; other runtime arguments are i32 (fp32 scale)."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "fp32" if name.startswith("scale") or name == "softcap" else "i32"
    triton.compile(ASTSource(kernel, signature, constexprs), target=HOPPER)


def compile_all(dtype: str) -> None:
    torch_dtype = TORCH_DTYPES[dtype]
    partials = dict(part_out_ptr="fp32", part_max_ptr="fp32", part_sum_ptr="fp32")
    tables = dict(block_tables_ptr="i32", context_lens_ptr="i32")
    caches = dict(key_cache_ptr=dtype, value_cache_ptr=dtype)
    for heads, kv_heads, head_dim, block_size in MODEL_SHAPES:
        # full attention and a sliding window, each with and without Gemma 2's soft cap
        for sliding, softcap in itertools.product((False, True), repeat=2):
            for partitions in (1, 8):
                compile_kernel(tk._decode_kernel,
                               dict(out_ptr=dtype, query_ptr=dtype, **partials, **caches, **tables),
                               tk.decode_constexprs(heads, kv_heads, head_dim, block_size, torch_dtype, partitions,
                                                    sliding, softcap))
            compile_kernel(tk._prefill_kernel,
                           dict(out_ptr=dtype, query_ptr=dtype, query_start_loc_ptr="i32", **caches, **tables),
                           tk.prefill_constexprs(heads, kv_heads, head_dim, block_size, torch_dtype, sliding,
                                                 softcap))
        compile_kernel(tk._merge_partitions_kernel, dict(out_ptr=dtype, context_lens_ptr="i32", **partials),
                       tk.merge_constexprs(head_dim, 8))
        compile_kernel(tk._reshape_and_cache_kernel,
                       dict(key_ptr=dtype, value_ptr=dtype, slot_mapping_ptr="i64", **caches),
                       tk.reshape_and_cache_constexprs(block_size, kv_heads, head_dim))
        compile_kernel(tk._copy_blocks_kernel, dict(first_cache_ptr=dtype, layer_offsets_ptr="i64",
                                                    mapping_ptr="i64"),
                       tk.copy_blocks_constexprs(block_size * kv_heads * head_dim))
        print(f"compiled all kernels for sm_90: {dtype}, heads {heads}/{kv_heads}, head_dim {head_dim}")


if __name__ == "__main__":
    if tk.INTERPRETED:
        sys.exit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    for name in sys.argv[1:] or list(TORCH_DTYPES):
        compile_all(name)
