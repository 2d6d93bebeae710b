"""A split-K variant of vLLM 0.32's Triton block-FP8 GEMM (`_w8a8_triton_block_scaled_mm`), for decode sizes.

At one to eight tokens vLLM's kernel gives one program per BLOCK_N columns: for the 235B EP8 shard's qkv layer
(N 1,280, K 4,096) that is 10-80 programs for the H200's 132 SMs, each walking all 32 K blocks. Here each program
takes a share of the K blocks (SPLIT_K shares: a second grid axis) and adds its partial sum into a float32 output
with atomics; the call zeroes that output first and casts it to the result dtype last, three kernels in all.
SPLIT_K 1 is vLLM's kernel as it is (one program per tile, the result stored directly). Kernel probe 16b
(bench/RESULTS-archive.md) timed it on the H200; bench/decode_gemm_bench.py sets it beside CUTLASS in the image.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])
def _block_fp8_mm_split_k(A, B, C, As, Bs, M, N, K, group_n, group_k,
                          stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                          stride_as_m, stride_as_k, stride_bs_k, stride_bs_n,
                          BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                          SPLIT_K: tl.constexpr):
    pid = tl.program_id(axis=0)
    pid_k = tl.program_id(axis=1)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_first = pid_k * per_split
    a_ptrs = A + offs_am[:, None] * stride_am + (k_first * BLOCK_SIZE_K + offs_k[None, :]) * stride_ak
    b_ptrs = B + (k_first * BLOCK_SIZE_K + offs_k[:, None]) * stride_bk + offs_bn[None, :] * stride_bn
    as_ptrs = As + offs_am * stride_as_m
    bs_ptrs = Bs + (offs_bn // group_n) * stride_bs_n
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(k_first, tl.minimum(k_first + per_split, k_tiles)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        scale_k = (k * BLOCK_SIZE_K) // group_k
        a_s = tl.load(as_ptrs + scale_k * stride_as_k)
        b_s = tl.load(bs_ptrs + scale_k * stride_bs_k)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = C + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(c_ptrs, acc, mask=mask, sem="relaxed")


def block_fp8_mm(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                 block: tuple[int, int], config: dict, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """a [M, K] FP8 with per-token-group scales [M, K / block_k] (row-major, as vLLM's Triton path quantizes), times
    b [N, K] FP8 with block scales [N / block_n, K / block_k]; config: BLOCK_SIZE_M/N/K (K = block_k), SPLIT_K,
    num_warps, num_stages."""
    m, k = a.shape
    n = b.shape[0]
    split = config.get("SPLIT_K", 1)
    out = torch.empty(m, n, device=a.device, dtype=out_dtype if split == 1 else torch.float32)
    if split > 1:
        out.zero_()
    grid = (triton.cdiv(m, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"]), split)
    _block_fp8_mm_split_k[grid](
        a, b, out, a_scale, b_scale, m, n, k, block[0], block[1],
        a.stride(0), a.stride(1), b.stride(1), b.stride(0), out.stride(0), out.stride(1),
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(1), b_scale.stride(0),
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"], BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        SPLIT_K=split, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out if split == 1 else out.to(out_dtype)
