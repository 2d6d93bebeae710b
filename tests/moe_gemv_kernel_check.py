"""Run bench/moe/gemv_kernel.py's decode fused-MoE kernel under Triton's interpreter (TRITON_INTERPRET=1, set by
tests/check_script.py) against the kernel harness's float32 reference, both GEMMs, on shapes with several routed
pairs a token and experts picked twice; prints one JSON object: case -> relative error. Used by
tests/test_moe_gemv_kernel.py. Values are float32 stand-ins for fp8 (the interpreter holds no fp8)."""
from __future__ import annotations

import json

import torch

from bench.moe.gemv_kernel import moe_gemv_block_fp8
from bench.moe.problem import Inputs, Weights, reference

SHAPES = {"ep-like": dict(E=4, topk=1, H=512, N=128, block=[128, 128]),
          "tp-like": dict(E=8, topk=3, H=256, N=256, block=[128, 128])}
CONFIGS = ({"BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 256, "num_warps": 4, "num_stages": 2},
           {"BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "num_warps": 4, "num_stages": 2})


def main() -> int:
    dev = torch.device("cpu")
    out = {}
    for name, shape in SHAPES.items():
        gen = torch.Generator().manual_seed(7)
        for M in (1, 3):
            inp = Inputs(shape, M, dev, gen)
            for gemm in ("w13", "w2"):
                W = Weights(shape, gemm, 1, dev, seed=11)
                ref = reference(shape, gemm, inp, W, 0)
                A, As, C, mul = inp.gemm_args(gemm)
                top_k = shape["topk"] if gemm == "w13" else 1
                for cfg in CONFIGS:
                    if (shape["H"] if gemm == "w13" else shape["N"]) % cfg["BLOCK_SIZE_K"]:
                        continue
                    C.fill_(float("nan"))
                    moe_gemv_block_fp8(A, As, W.B[0], W.Bs[0], C, inp.topk_ids, inp.topk_w, mul, top_k, cfg)
                    err = ((C.float() - ref).norm() / ref.norm()).item()
                    out[f"{name} M={M} {gemm} N{cfg['BLOCK_SIZE_N']}K{cfg['BLOCK_SIZE_K']}"] = err
    try:
        moe_gemv_block_fp8(A, As, W.B[0], W.Bs[0], C, inp.topk_ids, inp.topk_w, mul, 1,
                           {"BLOCK_SIZE_N": 96, "BLOCK_SIZE_K": 128})
        refused = None
    except ValueError as e:
        refused = str(e)
    print(json.dumps({"cases": out, "refused": refused}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
