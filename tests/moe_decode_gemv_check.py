"""Patch 0011's decode GEMV in the installed (patched) vLLM, in a process of its own with TRITON_INTERPRET=1 (set by
tests/check_script.py). Two parts; prints one JSON object.

- The kernel and its launcher, cut out of the installed fused_moe.py as the kernel harness cuts them
  (tests/moe_gemv_support.py; vLLM disables Triton on a CPU build; the interpreter runs the real Triton code),
  against the harness's float32 reference: both GEMMs at two configs, a pair of an expert the rank does not hold
  (-1: zeros), a batch of an EP rank with mapped ids, and a GEMV dict that is wrong.
- The choice in vLLM's invoke_fused_moe_triton_kernel, imported from the installed package, with its two kernels
  swapped for recorders: a GEMV dict on the naive assignment runs the GEMV, an aligned assignment or the switch
  off runs fused_moe_kernel without the GEMV key, a switch value that is not understood is an error; under an
  expert map, vLLM's _prepare_expert_assignment gives the mapped ids the naive assignment only where the second
  switch asks for it.
Values are float32 stand-ins for fp8 (the interpreter holds no fp8)."""
from __future__ import annotations

import json
import os

import torch

from bench.kernels.moe.problem import Inputs, Weights, reference
from check_script import env_set  # this script's folder comes first on its path
from moe_gemv_support import MappedBatch, load_gemv

SHAPE = dict(E=4, topk=2, H=512, N=256, block=[128, 128])
GEMV = {"BLOCK_SIZE_N": 8, "BLOCK_SIZE_K": 256, "num_warps": 4, "num_stages": 2}
# the probe's narrowest and widest tiles too, where K allows them (w13: K=512, w2: K=256)
GEMVS = (GEMV, {"BLOCK_SIZE_N": 2, "BLOCK_SIZE_K": 512, "num_warps": 2, "num_stages": 1},
         {"BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128})


def kernel_part(path: str) -> dict:
    mod = load_gemv(path)
    dev = torch.device("cpu")
    inp = Inputs(SHAPE, 3, dev, torch.Generator().manual_seed(5))
    out = {}
    for gemm in ("w13", "w2"):
        W = Weights(SHAPE, gemm, 1, dev, seed=3)
        A, As, C, mul = inp.gemm_args(gemm)
        top_k = SHAPE["topk"] if gemm == "w13" else 1
        ids = inp.topk_ids.reshape(-1).clone()
        ids[1] = -1  # token 0's second pair: an expert another rank holds
        ref = reference(SHAPE, gemm, inp, W, 0).reshape(-1, C.shape[-1])
        keep = torch.arange(ref.shape[0]) != 1
        for cfg in (c for c in GEMVS if A.shape[1] % c["BLOCK_SIZE_K"] == 0):
            C.fill_(float("nan"))
            ran = mod._lmi_invoke_fused_moe_gemv(A, W.B[0], C, As, W.Bs[0], inp.topk_w, ids, mul, top_k, cfg)
            got = C.reshape(-1, C.shape[-1])
            out[f"{gemm} N{cfg['BLOCK_SIZE_N']}K{cfg['BLOCK_SIZE_K']}"] = {
                "ran": ran, "relerr": ((got[keep] - ref[keep]).norm() / ref[keep].norm()).item(),
                "non_local_zeros": bool((got[1] == 0).all())}
    # a rank of an EP deployment: 3 tokens, top-4 of 8 global experts, this rank holding 0-3, the other rank's pairs
    # -1; a program per pair, and a program per token taking its 4 pairs in turn
    ep_shape = dict(SHAPE, ep=(8, 4))
    batch = MappedBatch(ep_shape, 3, dev, torch.Generator().manual_seed(11))
    kernel, grids = mod.lmi_fused_moe_gemv_kernel, []

    class Recorder:  # the launch's grid and PAIRS, then the kernel itself
        def __getitem__(self, grid):
            return lambda *a, **kw: grids.append((list(grid), kw["PAIRS"])) or kernel[grid](*a, **kw)

    mod.lmi_fused_moe_gemv_kernel = Recorder()
    for per_program in (1, batch.top_k):
        for gemm in ("w13", "w2"):
            W = Weights(SHAPE, gemm, 1, dev, seed=7)
            C = batch.args(gemm)[2]
            C.fill_(float("nan"))
            ran = batch.launch(mod, W.B[0], W.Bs[0], gemm, GEMV, per_program)
            ref = batch.reference(ep_shape, W.B[0], W.Bs[0], gemm).reshape(-1, C.shape[-1])
            got = C.reshape(-1, C.shape[-1])
            remote = batch.ids < 0
            out[f"mapped {gemm}, {per_program} pairs a program"] = {
                "ran": ran, "pairs": batch.ids.numel(), "local": batch.local_pairs, "grid": grids.pop(),
                "relerr": ((got[~remote] - ref[~remote]).norm() / ref[~remote].norm()).item(),
                "remote_zeros": bool((got[remote] == 0).all())}
    mod.lmi_fused_moe_gemv_kernel = kernel
    try:
        mod.lmi_check_gemv_config({"BLOCK_SIZE_N": 96, "BLOCK_SIZE_K": 256}, 256, 512)
        out["bad_config"] = None
    except ValueError as e:
        out["bad_config"] = str(e)
    return out


def dispatch_part() -> dict:
    import vllm.model_executor.layers.fused_moe.fused_moe as fm

    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append(("fused_moe_kernel", "GEMV" in kw))

    fm.fused_moe_kernel = Kernel()
    # (the GEMV dict it got, the routed pairs a program takes)
    fm._lmi_invoke_fused_moe_gemv = lambda *a: calls.append(("gemv", a[9] == GEMV, a[10])) or True
    A = torch.zeros(2, 512)
    B = torch.zeros(4, 256, 512)
    C = torch.zeros(2, 2, 256)
    As, Bs = torch.ones(2, 4), torch.ones(4, 2, 4)
    w = torch.ones(2, 2)
    ids = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    base = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)

    def call(config, sorted_ids=None, block=(128, 128)):
        fm.invoke_fused_moe_triton_kernel(
            A, B, C, As, Bs, w, sorted_ids, ids, torch.tensor([4]), False, 2, config, None,
            True, False, False, False, False, list(block) if block else None)
        return calls.pop()

    out = {"naive": call(dict(base, GEMV=GEMV))}
    with env_set(fm.LMI_MOE_DECODE_GEMV_EXPERT_MAP_ENV, "1"):
        out["naive, expert-map switch"] = call(dict(base, GEMV=GEMV))
    out.update({"aligned": call(dict(base, GEMV=GEMV), sorted_ids=torch.arange(4, dtype=torch.int32)),
                "no key": call(dict(base))})
    os.environ[fm.LMI_MOE_DECODE_GEMV_ENV] = "0"
    out["switch off"] = call(dict(base, GEMV=GEMV))
    os.environ[fm.LMI_MOE_DECODE_GEMV_ENV] = "sometimes"
    try:
        call(dict(base, GEMV=GEMV))
        out["bad switch"] = None
    except ValueError as e:
        out["bad switch"] = str(e)
    os.environ.pop(fm.LMI_MOE_DECODE_GEMV_ENV)
    out["expert map"] = expert_map_part(fm, base)
    return out


def expert_map_part(fm, base: dict) -> dict:
    """vLLM's _prepare_expert_assignment under an expert map (a rank holding global experts 4-7 of 16 as 0-3): the
    naive assignment of the mapped ids only with the switch on, a GEMV dict in the w13 entry and few pairs; else
    vLLM's alignment (its op swapped for a recorder)."""
    fm.moe_align_block_size = lambda *a, **kw: "aligned"
    expert_map = torch.full((16,), -1, dtype=torch.int32)
    expert_map[4:8] = torch.arange(4, dtype=torch.int32)
    topk_ids = torch.tensor([[4, 9, 7, -1]], dtype=torch.int32)  # one token, top-4; an invalid id last

    def assign(config, ids=topk_ids):
        r = fm._prepare_expert_assignment(ids, config, ids.shape[0], ids.shape[1], 16, expert_map,
                                          block_shape=[128, 128], ignore_invalid_experts=True)
        if r == "aligned":
            return "aligned"
        return {"sorted": r[0], "ids": r[1].tolist(), "dtype": str(r[1].dtype), "padded": r[2].tolist()}

    out = {"default": assign(dict(base, GEMV=GEMV))}
    env = fm.LMI_MOE_DECODE_GEMV_EXPERT_MAP_ENV
    os.environ[env] = "1"
    out["on"] = assign(dict(base, GEMV=GEMV))
    out["on, no key"] = assign(dict(base))
    out["on, many pairs"] = assign(dict(base, GEMV=GEMV), topk_ids.repeat(2, 1))
    os.environ[fm.LMI_MOE_DECODE_GEMV_ENV] = "0"
    out["on, GEMV off"] = assign(dict(base, GEMV=GEMV))
    os.environ.pop(fm.LMI_MOE_DECODE_GEMV_ENV)
    os.environ[env] = "maybe"
    try:
        assign(dict(base, GEMV=GEMV))
        out["bad"] = None
    except ValueError as e:
        out["bad"] = str(e)
    os.environ.pop(env)
    return out


def file_part() -> dict:
    """Which GEMMs get a GEMV dict from the candidate files for the Qwen3-Coder EP8 rank, as vLLM's patched config
    lookup reads them from VLLM_TUNED_CONFIG_FOLDER (the device named as the H200 the files were made for)."""
    from pathlib import Path

    import vllm.model_executor.layers.fused_moe.fused_moe as fm

    os.environ["VLLM_TUNED_CONFIG_FOLDER"] = str(Path(__file__).resolve().parents[1] / "bench" / "data"
                                                 / "h200_gemv_probe" / "candidates")
    fm.get_device_name_as_file_name = lambda: "NVIDIA_H200"
    fm.get_moe_configs.cache_clear()
    out = {}
    for m in (1, 2, 4, 8):
        w13, w2 = fm.try_get_optimal_moe_gemm_configs((20, 5120, 6144), (20, 6144, 2560), 1, "fp8_w8a8", m,
                                                      [128, 128])
        out[str(m)] = [g for g, c in (("w13", w13), ("w2", w2)) if "GEMV" in c]
    return out


def main() -> int:
    import importlib.util

    path = importlib.util.find_spec("vllm.model_executor.layers.fused_moe.fused_moe").origin
    print(json.dumps({"kernel": kernel_part(path), "file": file_part(), "dispatch": dispatch_part()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
