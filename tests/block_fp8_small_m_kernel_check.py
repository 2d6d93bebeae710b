"""Run patch 0010's small-M block-FP8 GEMM (the installed vLLM's own kernel and launcher, cut out of its patched
fp8_utils.py) under Triton's interpreter on the CPU: TRITON_INTERPRET=1 in the environment, read at import, so a
process of its own. Prints one JSON object: case -> relative error against a float32 reference of the block-scaled
product, the result's dtype and shape."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from bench.moe.kernel_source import load_definitions

BLOCK = 128


def main() -> None:
    import vllm

    fp8_utils = Path(vllm.__file__).parent / "model_executor/layers/quantization/utils/fp8_utils.py"
    mod = load_definitions(str(fp8_utils), ("_lmi_block_fp8_mm_small_m", "lmi_block_fp8_small_m_mm"), "fp8_small_m")
    torch.manual_seed(0)
    out = {}
    # K of 5 blocks: uneven shares over 2 and 4 splits, and with 8 splits shares that hold no block; N and M off the
    # tiles (masked columns and rows); activation scales row-major (Triton's quantization) and column-major (the
    # CUTLASS path's, which the tier receives)
    for (m, n, k), split, block_n, col_major in itertools.product(
            [(1, 256, 640), (3, 320, 640), (8, 1280, 512)], (1, 2, 4, 8), (32, 128), (False, True)):
        a = (torch.randn(m, k) * 0.5).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k) * 0.5).to(torch.float8_e4m3fn)
        a_s = torch.rand(m, k // BLOCK) + 0.5
        if col_major:
            a_s = a_s.t().contiguous().t()
        b_s = torch.rand((n + BLOCK - 1) // BLOCK, k // BLOCK) + 0.5
        b_full = b_s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)
        ref = (a.float() * a_s.repeat_interleave(BLOCK, 1)) @ (b.float() * b_full).T
        config = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=BLOCK, SPLIT_K=split, num_warps=4,
                      num_stages=3)
        y = mod.lmi_block_fp8_small_m_mm(a, b, a_s, b_s, [BLOCK, BLOCK], config, torch.bfloat16)
        out[f"M{m} N{n} K{k} split{split} BN{block_n}{' col-major' if col_major else ''}"] = {
            "rel_err": float((y.float() - ref).abs().max() / ref.abs().max()), "dtype": str(y.dtype),
            "shape": list(y.shape)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
