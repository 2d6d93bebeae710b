"""Patch 0011's and 0012's decode GEMV as the check scripts run it: the kernels and launchers cut out of a patched
fused_moe.py (the kernel harness's load_definitions), and a decode batch as a rank of an expert-parallel deployment
sees it."""
from __future__ import annotations

import torch

from bench.kernels.moe.kernel_source import load_definitions
from bench.kernels.moe.problem import Inputs, dequant_a, dequant_w

# Patch 0011's definitions (its launcher checks the config and launches the kernel)
GEMV_DEFINITIONS = ("LMI_MOE_DECODE_GEMV_ENV", "_LMI_GEMV_GROUP", "lmi_check_gemv_config",
                    "lmi_fused_moe_gemv_kernel", "_lmi_invoke_fused_moe_gemv")
# Patch 0012's: the w2 GEMV taking the w13 output, SiLU-and-mul and the FP8 group quantization in the kernel
SILU_DEFINITIONS = ("lmi_fused_moe_gemv_silu_kernel", "lmi_invoke_fused_moe_gemv_silu")


def load_gemv(fused_moe_py: str):
    """Patch 0011's and 0012's kernels and launchers from a patched fused_moe.py, as a module of their own."""
    return load_definitions(fused_moe_py, GEMV_DEFINITIONS + SILU_DEFINITIONS, "moe_gemv")


class MappedBatch:
    """One decode batch as a rank of the real EP deployment sees it: M tokens, each routed to the deployment's top-k
    of its global experts (shape["ep"]), this rank holding global experts 0..E-1; the ids mapped as an expert map
    would map them (another rank's expert: -1). The operands are the harness's Inputs over the global routing."""

    def __init__(self, shape: dict, M: int, dev, gen):
        experts, top_k = shape["ep"]
        self.top_k = top_k
        self.inp = Inputs(dict(shape, E=experts, topk=top_k), M, dev, gen)
        flat = self.inp.topk_ids.reshape(-1)
        self.ids = torch.where(flat < shape["E"], flat, torch.full_like(flat, -1)).contiguous()
        self.local_pairs = int((self.ids >= 0).sum())
        self.topk_w = self.inp.topk_w

    def args(self, gemm: str):
        """(A, A_scale, C, mul_routed_weight, top_k) of one GEMM."""
        return (*self.inp.gemm_args(gemm), self.top_k if gemm == "w13" else 1)

    def launch(self, gmod, B, Bs, gemm: str, config: dict, pairs_per_program: int = 1) -> bool:
        A, As, C, mul, top_k = self.args(gemm)
        return gmod._lmi_invoke_fused_moe_gemv(A, B, C, As, Bs, self.topk_w, self.ids, mul, top_k, config,
                                               pairs_per_program)

    def reference(self, shape: dict, B, Bs, gemm: str):
        """float32 result of every pair (zeros for another rank's expert's)."""
        A, As, C, mul, top_k = self.args(gemm)
        a = dequant_a(A, As, shape["block"])
        w = dequant_w(B, Bs, shape["block"])
        out = torch.zeros((self.ids.numel(), w.shape[1]), device=A.device, dtype=torch.float32)
        for p, e in enumerate(self.ids.tolist()):
            if e >= 0:
                out[p] = a[p // top_k] @ w[e].t() * (self.topk_w.reshape(-1)[p] if mul else 1.0)
        return out.view(C.shape)
