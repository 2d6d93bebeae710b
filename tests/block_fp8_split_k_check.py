"""Run bench/block_fp8_split_k.py's kernel under Triton's interpreter on the CPU (TRITON_INTERPRET=1 in the
environment, read at import: its own process). Prints one JSON object: case -> relative error against a float32
reference of the block-scaled product, and the result's dtype."""
from __future__ import annotations

import itertools
import json

import torch

from bench.block_fp8_split_k import block_fp8_mm

BLOCK = 128


def main() -> None:
    torch.manual_seed(0)
    out = {}
    # K of 5 blocks: uneven shares over 2 and 4 splits, and with 8 splits shares that hold no block; N and M off the
    # tiles (masked columns and rows)
    for (m, n, k), split, block_n in itertools.product([(1, 256, 640), (3, 320, 640), (8, 1280, 512)], (1, 2, 4, 8),
                                                       (32, 128)):
        a = (torch.randn(m, k) * 0.5).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k) * 0.5).to(torch.float8_e4m3fn)
        a_s = torch.rand(m, k // BLOCK) + 0.5
        b_s = torch.rand((n + BLOCK - 1) // BLOCK, k // BLOCK) + 0.5
        b_full = b_s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)
        ref = (a.float() * a_s.repeat_interleave(BLOCK, 1)) @ (b.float() * b_full).T
        y = block_fp8_mm(a, b, a_s, b_s, (BLOCK, BLOCK), dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=block_n,
                                                              BLOCK_SIZE_K=BLOCK, SPLIT_K=split, num_warps=4,
                                                              num_stages=3))
        out[f"M{m} N{n} K{k} split{split} BN{block_n}"] = {
            "rel_err": float((y.float() - ref).abs().max() / ref.abs().max()), "dtype": str(y.dtype),
            "shape": list(y.shape)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
