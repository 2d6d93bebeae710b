"""Patch 0012 (SiLU-and-mul and the w2 input's FP8 group quantization inside the decode GEMV) in the installed
(patched) vLLM, in a process of its own with TRITON_INTERPRET=1 (set by tests/check_script.py). Prints one JSON
object with two parts.

- The kernel and its launcher, cut out of the installed fused_moe.py (tests/moe_gemv_support.py), against vLLM's
  unfused path written out: SiLU-and-mul, the per-128-group scale max(amax, eps) / fp8 max (a power of two rounded
  up with UE8M0), the quotient clamped, then patch 0011's GEMV on those values and scales. Both scale formats, the
  routed weight, a pair of an expert the rank does not hold (zeros), operands it declines.
- The choice inside vLLM's TritonExperts.apply, imported from the installed package, on a stand-in for the experts
  object with its kernels swapped for recorders: the fused GEMV runs where the w2 entry holds a GEMV dict on the
  naive assignment with both switches on (0012's is off unless set), and vLLM's act_and_mul, quantization and w2
  GEMM run elsewhere.
Values are float32 stand-ins for fp8 (the interpreter holds no fp8), so the cast to FP8 is not exercised here.
"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import torch

from bench.kernels.moe.kernel_source import load_definitions
from check_script import env_set  # this script's folder comes first on its path
from moe_gemv_support import GEMV_DEFINITIONS, SILU_DEFINITIONS

GEMV = {"BLOCK_SIZE_N": 8, "BLOCK_SIZE_K": 256, "num_warps": 4, "num_stages": 2}
FP8_MAX, EPS = 448.0, 1e-10


def quantize_groups(act: torch.Tensor, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per_token_group_quant_fp8 (its Triton kernel's formula), float32 values standing in for fp8."""
    g = act.view(act.shape[0], -1, 128)
    scale = g.abs().amax(dim=2).clamp_min(EPS) * (1.0 / FP8_MAX)
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX)
    return q.view_as(act), scale


def kernel_part(path: str) -> dict:
    mod = load_definitions(path, GEMV_DEFINITIONS + SILU_DEFINITIONS, "moe_gemv_silu")
    gen = torch.Generator().manual_seed(7)
    E, N, K, M, top_k = 4, 256, 512, 3, 2
    pairs = M * top_k
    X = torch.randn(pairs, 2 * K, generator=gen) * 3
    B = torch.randint(-448, 449, (E, N, K), generator=gen).float()  # fp8 values, in float32
    Bs = torch.rand(E, N // 128, K // 128, generator=gen) * 1e-3 + 1e-4
    w = torch.rand(M, top_k, generator=gen)
    ids = torch.tensor([0, 3, -1, 1, 2, 2], dtype=torch.int32)
    act = torch.nn.functional.silu(X[:, :K]) * X[:, K:]
    out = {}
    for ue8m0 in (True, False):
        q, scale = quantize_groups(act, ue8m0)
        for mul in (True, False):
            ref = torch.full((M, top_k, N), float("nan"))
            assert mod._lmi_invoke_fused_moe_gemv(q, B, ref, scale, Bs, w, ids, mul, 1, GEMV)
            got = torch.full((M, top_k, N), float("nan"))
            ran = mod.lmi_invoke_fused_moe_gemv_silu(X, B, got, Bs, w, ids, mul, GEMV, ue8m0, FP8_MAX)
            got, ref = got.view(pairs, N), ref.view(pairs, N)
            local = ids >= 0
            out[f"ue8m0={ue8m0} mul={mul}"] = {
                "ran": ran, "relerr": ((got[local] - ref[local]).norm() / ref[local].norm()).item(),
                "zeros": bool((got[~local] == 0).all()), "sum": got[local].double().sum().item()}
    out["declines a w13 output of the wrong width"] = mod.lmi_invoke_fused_moe_gemv_silu(
        X[:, : K + 128], B, torch.empty(M, top_k, N), Bs, w, ids, True, GEMV, True, FP8_MAX)
    try:
        mod.lmi_invoke_fused_moe_gemv_silu(X, B, torch.empty(M, top_k, N), Bs, w, ids, True,
                                           {"BLOCK_SIZE_N": 96, "BLOCK_SIZE_K": 256}, True, FP8_MAX)
        out["bad_config"] = None
    except ValueError as e:
        out["bad_config"] = str(e)
    return out


def apply_part() -> dict:
    """TritonExperts.apply on one decode batch (one token, top-1, 4 experts: vLLM's naive assignment) with the
    module's kernels swapped for recorders; returns what ran for each case."""
    import vllm.model_executor.layers.fused_moe.experts.triton_moe as tm
    import vllm.model_executor.layers.fused_moe.fused_moe as fm
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    import triton.language

    tm.tl = triton.language  # vLLM's CPU build holds a placeholder for it
    calls: list = []
    tm.invoke_fused_moe_triton_kernel = lambda A, B, *a, **kw: calls.append(("gemm", tuple(B.shape)))
    tm.moe_kernel_quantize_input = lambda A, *a, **kw: calls.append(("quant",)) or (A, None)
    tm.is_deep_gemm_e8m0_used = lambda: True
    # (the GEMV dict, UE8M0, the FP8 max, the routed pairs a program takes)
    tm.lmi_invoke_fused_moe_gemv_silu = lambda *a: calls.append(("gemv_silu", a[7] == GEMV, a[8], a[9], a[10])) or True
    E, N2, H = 4, 512, 256
    w1, w2 = torch.zeros(E, N2, H), torch.zeros(E, H, N2 // 2)
    base = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)

    def run(w2_gemv=True, tokens=1, clamp=None):
        tm.try_get_optimal_moe_gemm_configs = lambda *a, **kw: (
            dict(base), dict(base, GEMV=GEMV) if w2_gemv else dict(base))
        me = SimpleNamespace(
            quant_config=SimpleNamespace(use_int4_w4a16=False, use_int8_w8a16=False, use_int8_w8a8=False,
                                         use_fp8_w8a8=True, config_name=lambda dtype: "fp8_w8a8"),
            expects_unquantized_inputs=False, block_shape=[128, 128], quant_dtype=torch.float8_e4m3fn,
            per_act_token_quant=False, quantization_emulation=False, _lora_context=None, a1_scale=None,
            w1_scale=torch.ones(E, 4, 2), w2_scale=torch.ones(E, 2, 2), w1_bias=None, w2_bias=None,
            activation_config=SimpleNamespace(clamp_limit=clamp),
            activation=lambda act, out, x: calls.append(("act_and_mul",)),
            moe_sum=lambda inp, out, ids, emap: calls.append(("moe_sum",)),
            adjust_N_for_activation=lambda n, act: n // 2)
        me.moe_problem_size = lambda a1, w1, w2, ids: tm.mk.FusedMoEExpertsModular.moe_problem_size(
            me, a1, w1, w2, ids)
        ids = torch.arange(tokens, dtype=torch.int32).remainder(E).view(tokens, 1)
        tm.TritonExperts.apply(
            me, torch.zeros(tokens, H), torch.zeros(tokens, H), w1, w2, torch.ones(tokens, 1), ids,
            MoEActivation.SILU, E, None, None, None, torch.zeros(tokens * N2), torch.zeros(tokens * max(N2, H)), None, False)
        got = list(calls)
        calls.clear()
        return got

    # vLLM's alignment (a CUDA op) for batches of many pairs
    fm.moe_align_block_size = lambda *a, **kw: (torch.zeros(16, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                                                torch.tensor([16]))
    out = {"default": run()}
    os.environ[fm.LMI_MOE_DECODE_GEMV_SILU_ENV] = "1"
    out.update({"gemv entry": run(), "no gemv entry": run(w2_gemv=False),
                "two pairs (aligned)": run(tokens=2), "clamp limit": run(clamp=7.0)})
    for env, value, case in ((fm.LMI_MOE_DECODE_GEMV_SILU_ENV, "0", "switch off"),
                             (fm.LMI_MOE_DECODE_GEMV_ENV, "0", "gemv off"),
                             (fm.LMI_MOE_DECODE_GEMV_EXPERT_MAP_ENV, "1", "expert-map switch"),
                             (fm.LMI_MOE_DECODE_GEMV_SILU_ENV, "later", "bad switch")):
        with env_set(env, value):
            try:
                out[case] = run()
            except ValueError as e:
                out[case] = str(e)
    os.environ.pop(fm.LMI_MOE_DECODE_GEMV_SILU_ENV)
    return out


def main() -> int:
    import importlib.util

    path = importlib.util.find_spec("vllm.model_executor.layers.fused_moe.fused_moe").origin
    print(json.dumps({"kernel": kernel_part(path), "apply": apply_part()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
