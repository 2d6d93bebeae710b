"""A candidate fused-MoE kernel for decode under expert parallelism (block FP8, w8a8): one program per (routed
pair, BLOCK_N outputs), reading the expert's weight rows as a matrix-vector product on CUDA cores.

Why a second kernel: at one token an EP8 rank runs about one (token, expert) pair, and vLLM's `fused_moe_kernel`
pads that pair to a 16-row tile for the tensor cores, launches a grid sized for every expert's padding and walks K
in 128-wide steps per 64-column tile; on the Qwen3-Coder EP8 rank its tuned one-token w13 + w2 take 25.0 µs against
an 11.1 µs memory floor (run 10). A matrix-vector product needs no tensor core: this kernel launches exactly the
programs that have work (pairs x N tiles), each streaming BLOCK_N rows of its expert over all of K in BLOCK_K-wide
steps with the block scales applied per 128-group. Measured against vLLM's kernel by bench/moe_gemv_probe.py; not
wired into vLLM.

Layouts are vLLM's (`invoke_fused_moe_triton_kernel`, fp8 w8a8 with block_shape [128, 128]):
A [M, K] fp8 with A_scale [M, K / 128] (per token group), B [E, N_out, K] fp8 with B_scale [E, N_out / 128,
K / 128], topk_ids [M, top_k], C [M, top_k, N_out]; w13 reads A's row pair // top_k, w2 (top_k=1 over the
M * top_k rows of the activated w13 output) its row `pair` and multiplies by the pair's routed weight.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP = 128  # the block-FP8 checkpoints' scale block, both dimensions


@triton.jit
def moe_gemv_block_fp8_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, ids_ptr, w_ptr, K,
                              stride_am, stride_asm, stride_be, stride_bn, stride_bse, stride_bsn, stride_cm,
                              TOP_K: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr):
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    row = pair // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_group = (pid_n * BLOCK_N) // GROUP_K  # BLOCK_N divides 128: one scale row per program
    G: tl.constexpr = BLOCK_K // GROUP_K
    offs_g = tl.arange(0, G)
    a_row = a_ptr + row * stride_am
    b_rows = b_ptr + expert * stride_be + offs_n[:, None].to(tl.int64) * stride_bn
    bs_row = bs_ptr + expert * stride_bse + n_group * stride_bsn
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_row + offs_k).to(tl.float32)
        b = tl.load(b_rows + offs_k[None, :]).to(tl.float32)
        part = tl.sum(tl.reshape(b * a[None, :], (BLOCK_N, G, GROUP_K)), axis=2)  # [BLOCK_N, G]
        scale = tl.load(as_ptr + row * stride_asm + k0 // GROUP_K + offs_g) * tl.load(bs_row + k0 // GROUP_K + offs_g)
        acc += tl.sum(part * scale[None, :], axis=1)
    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(w_ptr + pair)
    tl.store(c_ptr + pair * stride_cm + offs_n, acc.to(c_ptr.dtype.element_ty))


def moe_gemv_block_fp8(A: torch.Tensor, A_scale: torch.Tensor, B: torch.Tensor, B_scale: torch.Tensor,
                       C: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, mul_routed_weight: bool,
                       top_k: int, config: dict) -> None:
    """C[pair] = A[row] @ B[expert].T with block scales, for every routed pair (config: BLOCK_SIZE_N dividing 128,
    BLOCK_SIZE_K a multiple of 128 dividing K, num_warps, num_stages)."""
    n_out, K = B.shape[1], B.shape[2]
    bn, bk = config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    if GROUP % bn or bk % GROUP or K % bk or n_out % bn:
        raise ValueError(f"BLOCK_SIZE_N {bn} must divide {GROUP} and N {n_out}; BLOCK_SIZE_K {bk} must be a multiple "
                         f"of {GROUP} dividing K {K}")
    pairs = topk_ids.numel()
    c = C.view(pairs, n_out)
    moe_gemv_block_fp8_kernel[(pairs, n_out // bn)](
        A, A_scale, B, B_scale, c, topk_ids, topk_weights, K,
        A.stride(0), A_scale.stride(0), B.stride(0), B.stride(1), B_scale.stride(0), B_scale.stride(1), c.stride(0),
        TOP_K=top_k, MUL_ROUTED_WEIGHT=mul_routed_weight, BLOCK_N=bn, BLOCK_K=bk, GROUP_K=GROUP,
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 3))


def candidate_configs(space: str = "default") -> list[dict]:
    """The configs the probe tries: narrow N tiles for many programs, wide K steps for bytes in flight. "wide" goes
    past the default's edges (the first probe's best were its narrowest N and widest K)."""
    if space == "wide":
        return [{"BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "num_warps": w, "num_stages": s}
                for bn in (2, 4, 8) for bk in (512, 1024, 2048) for w in (2, 4, 8) for s in (1, 2, 3)]
    return [{"BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "num_warps": w, "num_stages": s}
            for bn in (8, 16, 32) for bk in (256, 512) for w in (4, 8) for s in (2, 4)]
