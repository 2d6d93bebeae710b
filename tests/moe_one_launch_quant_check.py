"""Run patch 0006's one-launch FP8 quantization kernel under Triton's interpreter.

Run by path with TRITON_INTERPRET=1 in the environment (Triton reads it at import, so a separate process);
prints one JSON object: case -> what was compared. The kernel and its helpers are the installed vLLM's own
(vllm/model_executor/layers/fused_moe/utils.py), taken from that file by name and run with Triton itself
(vLLM's CPU build puts a stand-in for Triton in its own modules). The interpreter's fp8 conversion is not
Hopper's (it rounds values near a power of two to the wrong binade), so the quantized values are written as
float32 here and compared before the fp8 rounding; bench/kernels/fp8_quant.py compares the fp8 bits against
vLLM's CUDA op on the H200.
"""
from __future__ import annotations

import json
import os

import torch

from check_script import patched_definitions  # this script's folder comes first on its path

NAMES = ("LMI_FP8_MOE_ONE_LAUNCH_QUANT_ENV", "_ONE_LAUNCH_QUANT_BLOCKS", "_lmi_one_launch_quant_enabled",
         "_per_tensor_fp8_quant_one_launch_kernel", "_one_launch_quant_block")

utils = patched_definitions("model_executor/layers/fused_moe/utils.py", NAMES, "0006", "one_launch_quant")

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's CUDA op before the fp8 rounding: scale = absmax / fp8_max, x * (1 / scale), clamped; NaN -> max."""
    scale = x.float().abs().max() / FP8_MAX
    q = x.float() * (1.0 / scale)
    q = torch.where(torch.isnan(q), torch.full_like(q, FP8_MAX), q.clamp(-FP8_MAX, FP8_MAX))
    return q, scale.reshape(1)


def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty(x.shape, dtype=torch.float32)
    scale = torch.empty(1, dtype=torch.float32)
    block = utils._one_launch_quant_block(x.numel())
    utils._per_tensor_fp8_quant_one_launch_kernel[(1,)](x, q, scale, x.numel(), FP8_MAX=FP8_MAX, BLOCK=block)
    return q, scale


def main() -> None:
    g = torch.Generator().manual_seed(0)
    cases = {}
    # decode shapes: w13 input (tokens x hidden), w2 input (tokens x top-k x N) of the TP8 shards
    shapes = {"w13 235B 1 token": (1, 4096), "w13 Coder 1 token": (1, 6144), "w13 235B 2 tokens": (2, 4096),
              "w2 235B 1 token": (8, 192), "w2 Coder 2 tokens": (16, 320), "w2 235B 4 tokens": (32, 192),
              "odd 3x100": (3, 100)}
    for name, shape in shapes.items():
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            x = (torch.randn(shape, generator=g) * 5).to(dtype)
            x.view(-1)[7] = -40.0  # the abs-max is a negative value
            q, scale = run(x)
            rq, rscale = reference(x)
            cases[f"{name} {dtype}"] = {"scale_equal": bool(scale[0] == rscale[0]),
                                        "q_equal": bool(torch.equal(q, rq)),
                                        "block": utils._one_launch_quant_block(x.numel())}
    q, scale = run(torch.zeros(2, 1024, dtype=torch.bfloat16))
    cases["all zeros"] = {"scale": float(scale[0]), "q_values": sorted(set(q.flatten().tolist()))}
    try:
        utils._one_launch_quant_block(8193)
        cases["over the limit"] = "accepted"
    except ValueError as e:
        cases["over the limit"] = str(e)
    for value in ("", "1", "on", "0", "off", "maybe"):
        os.environ[utils.LMI_FP8_MOE_ONE_LAUNCH_QUANT_ENV] = value
        utils._lmi_one_launch_quant_enabled.cache_clear()
        try:
            cases[f"switch {value!r}"] = utils._lmi_one_launch_quant_enabled()
        except ValueError as e:
            cases[f"switch {value!r}"] = str(e)
    print(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
