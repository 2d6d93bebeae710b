"""Run patch 0004's split-K fused-MoE kernel under Triton's interpreter.

Run as `python tests/moe_split_k_check.py <vLLM fused_moe.py> [SHAPE ...]` from the
repository root with TRITON_INTERPRET=1 in the environment (Triton reads it
when it is imported, so a separate process); prints one JSON object: case -> relative error
(or the error), plus whether the split-K workspace was left zeroed. SHAPE names
entries of SHAPES (all when none is given), so the shapes can run in processes side by side. Used by
tests/test_moe_split_k_kernel.py. Values are float32 stand-ins for fp8 (the
interpreter holds no fp8); the kernel and vLLM's launcher for it are the
file's own, loaded as the H200 harness loads them.
"""
from __future__ import annotations

import json
import sys

import torch

from bench.kernels.moe.kernel_source import load_kernel
from bench.kernels.moe.problem import Inputs, Weights, check, reference

SHAPES = {
    "per-tensor": dict(E=8, topk=2, H=256, N=96, block=None),
    "block-128": dict(E=16, topk=4, H=256, N=128, block=[128, 128]),
}
BASE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
        "num_stages": 2}
CONFIGS = {
    "unsplit": BASE,
    "k2": dict(BASE, SPLIT_K=2),
    "k3-swap": dict(BASE, SPLIT_K=3, SWAP_AB=True),
    "k2-bm32-group": dict(BASE, BLOCK_SIZE_M=32, GROUP_SIZE_M=2, SPLIT_K=2),
}


def main() -> int:
    kmod, _ = load_kernel(sys.argv[1], "checked")
    calls = []
    real = kmod._invoke_fused_moe_kernel_split_k
    kmod._invoke_fused_moe_kernel_split_k = lambda *a, **k: calls.append(1) or real(*a, **k)
    dev = torch.device("cpu")
    out = {"cases": {}}
    for shape in sys.argv[2:] or SHAPES:
        sh = SHAPES[shape]
        for M in (1, 9):  # naive assignment (M*top_k*4 <= E) at M=1, aligned at 9
            inp = Inputs(sh, M, dev, torch.Generator(device=dev).manual_seed(M))
            for i, gemm in enumerate(("w13", "w2")):
                W = Weights(sh, gemm, 1, dev, seed=i)
                ref = reference(sh, gemm, inp, W, 0)
                for name, cfg in CONFIGS.items():
                    # a second launch must find the workspace zeroed again: launched twice at M=1, where a launch
                    # is cheapest under the interpreter; that every workspace (M=9's too) is left zeroed, which is
                    # what a second launch relies on, is checked below
                    for rep in range(2 if M == 1 else 1):
                        n0 = len(calls)
                        try:
                            ok, err = check(kmod, sh, gemm, inp, W, cfg, ref)
                            res = {"ok": ok, "relerr": err}
                        except Exception as ex:  # noqa: BLE001
                            res = {"ok": False, "error": repr(ex)[-300:]}
                        res["split_k_kernel"] = len(calls) > n0
                        out["cases"][f"{shape} M={M} {gemm} {name} launch {rep}"] = res
    out["workspace_zeroed"] = all(not p.any() and not c.any() for p, c in kmod._SPLIT_K_WORKSPACES.get(dev, []))
    out["workspaces"] = len(kmod._SPLIT_K_WORKSPACES.get(dev, []))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
