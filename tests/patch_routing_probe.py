"""Run vLLM's real FP8 MoE backend selection under CUDA platform stand-ins.

Run as a script with PYTHONPATH set to the directory holding the vllm sources
to test (patched or pristine); prints one JSON object: scenario -> result.
Used by tests/test_moe_routing.py, which compares patched and pristine.

The modules are imported under the real CPU platform (their import-time code
must see the platform it runs on); then the stand-in replaces the platform
object everywhere vLLM bound it, which is what vLLM would have seen at start
on such a GPU. Everything else is real: FusedMoEConfig, FusedMoEParallelConfig,
Fp8Config / Fp8MoEMethod, quant keys, expert classes' support checks.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from types import SimpleNamespace

import torch

import vllm.logger
import vllm.platforms
from vllm.platforms import current_platform as cpu_platform

# The modules the series patches must import on the CPU build.
import vllm.model_executor.layers.fused_moe.experts.fused_batched_moe  # noqa: F401
import vllm.model_executor.layers.fused_moe.fused_moe  # noqa: F401
import vllm.model_executor.layers.fused_moe.oracle.fp8 as oracle
import vllm.model_executor.layers.quantization.compressed_tensors.triton_scaled_mm  # noqa: F401
import vllm.model_executor.layers.quantization.utils.fp8_utils  # noqa: F401
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    RoutingMethodType,
)
from vllm.model_executor.layers.quantization.fp8 import Fp8Config, Fp8MoEMethod
from vllm.model_executor.layers.quantization.modelopt import (
    ModelOptFp8Config,
    ModelOptFp8MoEMethod,
)
from vllm.model_executor.layers.quantization.utils import quant_utils as qu
from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum


def cuda_stand_in(major: int, minor: int) -> Platform:
    """A CUDA platform of the given compute capability (no GPU behind it)."""

    class CudaStandIn(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major, minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"stand-in sm_{major}{minor}"

        @classmethod
        def supports_fp8(cls) -> bool:
            return cls.has_device_capability(89)  # as vLLM's CudaPlatform

    return CudaStandIn()


_active = cpu_platform


def use_platform(platform) -> None:
    global _active
    vllm.platforms._current_platform = platform
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if namespace is not None and namespace.get("current_platform") is _active:
            namespace["current_platform"] = platform
    _active = platform


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


capture = Capture()
oracle.logger.addHandler(capture)
oracle.logger.setLevel(logging.DEBUG)


def fresh_logs() -> None:
    # info_once/debug_once remember messages; each scenario must log afresh.
    for value in vars(vllm.logger).values():
        if hasattr(value, "cache_clear"):
            value.cache_clear()
    capture.messages.clear()


def moe_config(tp: int = 2, ep: int = 1, backend: str = "auto") -> FusedMoEConfig:
    parallel = FusedMoEParallelConfig(
        tp_size=1 if ep > 1 else tp, pcp_size=1, dp_size=1, ep_size=ep,
        tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=0, sp_size=1,
        use_ep=ep > 1, all2all_backend="allgather_reducescatter", enable_eplb=False)
    return FusedMoEConfig(
        num_experts=128, experts_per_token=8, hidden_dim=2048,
        intermediate_size=768 * max(tp, 1), num_local_experts=128 // ep,
        num_logical_experts=128, activation=MoEActivation.SILU, device="cuda",
        routing_method=RoutingMethodType.Renormalize, moe_parallel_config=parallel,
        in_dtype=torch.bfloat16, moe_backend=backend)


KEYS = {
    "per-tensor-static": (qu.kFp8StaticTensorSym, qu.kFp8StaticTensorSym),
    "per-tensor-dynamic": (qu.kFp8StaticTensorSym, qu.kFp8DynamicTensorSym),
    "block": (qu.kFp8Static128BlockSym, qu.kFp8Dynamic128Sym),
    "channel-token": (qu.kFp8StaticChannelSym, qu.kFp8DynamicTokenSym),
}


def run(scenario: dict) -> dict:
    os.environ.pop("LMI_FP8_MOE_STOCK_ORDER", None)
    if scenario.get("env") is not None:
        os.environ["LMI_FP8_MOE_STOCK_ORDER"] = scenario["env"]
    use_platform(cuda_stand_in(*scenario.get("capability", (9, 0))))
    cfg = moe_config(scenario.get("tp", 2), scenario.get("ep", 1),
                     scenario.get("backend", "auto"))
    out: dict = {}
    fresh_logs()
    if "modelopt_fp8_config" in scenario:
        # ModelOpt FP8 checkpoints (e.g. the one vllm PR #50040 measured)
        try:
            method = ModelOptFp8MoEMethod(
                ModelOptFp8Config(**scenario["modelopt_fp8_config"]), cfg)
            out["selected"] = method.fp8_backend.value
        except Exception as e:
            out["selected"] = f"error: {type(e).__name__}: {e}"
    elif "fp8_config" in scenario:
        # The real quantization method derives the keys and calls the oracle.
        try:
            method = Fp8MoEMethod(Fp8Config(**scenario["fp8_config"]),
                                  SimpleNamespace(moe_config=cfg))
            out["selected"] = method.fp8_backend.value
        except Exception as e:  # the error is the result under test
            out["selected"] = f"error: {type(e).__name__}: {e}"
    else:
        weight_key, activation_key = KEYS[scenario["keys"]]
        try:
            out["order"] = [b.value for b in oracle._get_priority_backends(
                cfg, weight_key, activation_key)]
        except Exception as e:
            out["order"] = f"error: {type(e).__name__}: {e}"
        try:
            out["selected"] = oracle.select_fp8_moe_backend(
                cfg, weight_key, activation_key)[0].value
        except Exception as e:
            out["selected"] = f"error: {type(e).__name__}: {e}"
    out["log"] = list(capture.messages)
    return out


if __name__ == "__main__":
    scenarios = json.loads(sys.argv[1])
    results = {name: run(s) for name, s in scenarios.items()}
    results["_oracle_file"] = oracle.__file__
    sys.stdout.write("\nPROBE-RESULT " + json.dumps(results) + "\n")
