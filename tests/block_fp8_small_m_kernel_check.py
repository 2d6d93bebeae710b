"""Run patch 0010's small-M block-FP8 GEMM (the installed vLLM's own kernel and launcher, cut out of its patched
fp8_utils.py) under Triton's interpreter on the CPU: TRITON_INTERPRET=1 in the environment, read at import, so a
process of its own. Prints one JSON object: case -> relative error against a float32 reference of the block-scaled
product of the input quantized as vLLM quantizes it, the result's dtype and shape."""
from __future__ import annotations

import itertools
import json

import torch
import triton
import triton.language as tl

from bench.kernels.moe.kernel_source import load_definitions
from check_script import vllm_file  # this script's folder comes first on its path

BLOCK = 128
# The GEMV cases, (tokens, activation-scale layout) -> (BLOCK_SIZE_N, BLOCK_SIZE_K) each: 8-row programs sharing a
# scale row, a token padded to a power of two (3 -> 4), column-major scales, K steps of one group and of four
GEMV_CASES = {(1, "row"): ((8, BLOCK),), (3, "col-major"): ((32, BLOCK),), (8, "row"): ((32, 512),),
              (8, "col-major"): ((32, BLOCK),)}


def main() -> None:
    fp8_utils = vllm_file("model_executor/layers/quantization/utils/fp8_utils.py")
    mod = load_definitions(str(fp8_utils), ("LMI_GEMV_KEY", "_lmi_block_fp8_mm_small_m", "lmi_block_fp8_small_m_mm",
                                            "_lmi_block_fp8_gemv", "lmi_block_fp8_gemv"), "fp8_small_m")
    torch.manual_seed(0)
    out = {}
    # K of 5 blocks: uneven shares over 2 and 4 splits, and with 8 splits shares that hold no block; N and M off the
    # tiles (masked columns and rows); the input as fp8 with row-major scales (Triton's quantization), with
    # column-major scales (the CUTLASS path's, which the tier receives), and as bf16 quantized in the kernel
    for (m, n, k), split, block_n, layout in itertools.product(
            [(1, 256, 640), (3, 320, 640), (8, 384, 512)], (1, 2, 4, 8), (32, 128), ("row", "col-major", "bf16")):
        x = torch.randn(m, k, dtype=torch.bfloat16) * 3
        x[0, :BLOCK] = 0  # a group of zeros: scale eps, as vLLM's quantization gives it
        a, a_s = group_quant(x, triton_cast=layout == "bf16")
        if layout == "col-major":
            a_s = a_s.t().contiguous().t()
        b = (torch.randn(n, k) * 0.5).to(torch.float8_e4m3fn)
        b_s = torch.rand((n + BLOCK - 1) // BLOCK, k // BLOCK) + 0.5
        b_full = b_s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)
        ref = (a.float() * a_s.repeat_interleave(BLOCK, 1)) @ (b.float() * b_full).T
        config = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=BLOCK, SPLIT_K=split, num_warps=4,
                      num_stages=3)
        if layout == "bf16":
            y = mod.lmi_block_fp8_small_m_mm(x, b, None, b_s, [BLOCK, BLOCK], config, torch.bfloat16)
        else:
            y = mod.lmi_block_fp8_small_m_mm(a, b, a_s, b_s, [BLOCK, BLOCK], config, torch.bfloat16)
        out[f"M{m} N{n} K{k} split{split} BN{block_n} {layout}"] = result(y, ref)
        if split == 1 and block_n == 32:
            # the GEMV entry through the same launcher (GEMV_CASES: each program interpreted costs seconds)
            for gemv_n, gemv_k in GEMV_CASES.get((m, layout), ()):
                gemv = dict(BLOCK_SIZE_N=gemv_n, BLOCK_SIZE_K=gemv_k, num_warps=4, num_stages=2)
                y = mod.lmi_block_fp8_small_m_mm(a, b, a_s, b_s, [BLOCK, BLOCK], {mod.LMI_GEMV_KEY: gemv},
                                                 torch.bfloat16)
                out[f"M{m} N{n} K{k} GEMV BN{gemv_n} BK{gemv_k} {layout}"] = result(y, ref)
    print(json.dumps(out))


def result(y: torch.Tensor, ref: torch.Tensor) -> dict:
    return {"rel_err": float((y.float() - ref).abs().max() / ref.abs().max()), "dtype": str(y.dtype),
            "shape": list(y.shape)}


def group_quant(x: torch.Tensor, triton_cast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's dynamic per-token-group FP8 quantization (_per_token_group_quant_fp8's arithmetic), groups of 128. With
    triton_cast the float32 -> fp8 cast is Triton's, as the kernel's own: Triton's interpreter rounds a value whose
    rounding carries into the exponent to half of it (124.2 -> 64, where torch and the GPU's cvt.rn give 128), so the
    in-kernel quantization is checked against the cast it runs with."""
    g = x.float().view(x.shape[0], -1, BLOCK)
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    scale = g.abs().amax(dim=-1).clamp_min(1e-10) * (1.0 / fp8_max)
    y = (g / scale[..., None]).clamp(-fp8_max, fp8_max).reshape(-1).contiguous()
    q = torch.empty_like(y, dtype=torch.float8_e4m3fn)
    if triton_cast:
        _cast[(triton.cdiv(y.numel(), 1024),)](y, q, y.numel(), BLOCK_N=1024)
    else:
        q = y.to(torch.float8_e4m3fn)
    return q.view(x.shape), scale


@triton.jit
def _cast(X, Y, n, BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n).to(Y.dtype.element_ty), mask=offs < n)


if __name__ == "__main__":
    main()
