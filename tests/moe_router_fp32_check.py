"""Build patch 0009's GateLinear (the installed vLLM's own, patched) as on a Hopper GPU and report what it chose.

Run by path in its own process: it starts vLLM's single-rank distributed state (gloo) that a linear layer needs,
and makes vLLM's platform answer as CUDA on compute capability 9.0 (the CPU build's is not), so that the gate's
specialized tiers are eligible. Prints one JSON object: case -> the gate's out_dtype and tier flags, or the error.
"""
from __future__ import annotations

import json
import os
import socket
from unittest import mock

import torch

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.kernels.linear.cute_dsl.ll_bf16 import is_available as ll_bf16_available
from vllm.model_executor.layers.fused_moe.router import gate_linear
from vllm.platforms import current_platform

ENV = gate_linear.LMI_MOE_ROUTER_FP32_ENV


def state(g) -> dict:
    return {"out_dtype": str(g.out_dtype), "cublas_tier": g.allow_cublas_router_gemm,
            "ll_bf16_tier": g.allow_ll_bf16_gemm}


def case(value: str | None, **kwargs) -> dict:
    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value
    try:
        g = gate_linear.GateLinear(256, 16, params_dtype=torch.bfloat16, **kwargs)
    except ValueError as e:
        return {"error": str(e)}
    out = {"built": state(g)}  # the tiers' kernels themselves run on a GPU only (bench/kernels/decode_gemm.py)
    try:
        g.set_out_dtype(torch.float32)  # what an expert method needing float32 logits calls after build
        out["after_set_fp32"] = state(g)
    except ValueError as e:
        out["after_set_fp32"] = str(e)
        return out
    try:
        g.set_out_dtype(torch.float32)
        out["set_again"] = "allowed"
    except ValueError as e:
        out["set_again"] = str(e)
    return out


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    platform = type(current_platform)
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
    with set_current_vllm_config(VllmConfig()), \
            mock.patch.object(platform, "is_cuda", return_value=True), \
            mock.patch.object(platform, "is_device_capability", side_effect=lambda cap: tuple(cap) == (9, 0)), \
            mock.patch.object(platform, "is_device_capability_family", return_value=False):
        report = {
            "ll_bf16_available": ll_bf16_available(),
            "on": case("1"),
            "on_with_bf16_set_later": None,
            "off": case("0"),
            "unset": case(None),
            "model_fp32": case("1", out_dtype=torch.float32),
            "bad": case("sometimes"),
        }
        os.environ[ENV] = "1"
        g = gate_linear.GateLinear(256, 16, params_dtype=torch.bfloat16)
        g.set_out_dtype(torch.bfloat16)
        report["on_with_bf16_set_later"] = state(g)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
