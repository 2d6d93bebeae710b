"""The linear kernel of block-FP8 layers on a GPU host without nvcc, run by the launcher.

Qwen's and DeepSeek's official FP8 checkpoints are block FP8 (weight_block_size [128, 128]). For their linear layers
vLLM 0.32 on Hopper picks FlashInfer's DeepGEMM kernel, else DeepGEMM (`--linear-backend auto`), and both compile
their kernels with nvcc when the engine starts: on an H200 with nvcc that was FlashInfer's fp8_blockscale_gemm_90
build and DeepGEMM's warm-up over 512 shapes, 42-48 minutes by its own estimate (bench/RESULTS-archive.md, run 2).
The image's runtime base has no nvcc on its paths, so DeepGEMM's JIT would stop the start there.

Where no nvcc is found and the user chose no linear backend, the launcher hands vLLM `kernel_config`'s
`linear_backend_per_quant` = {"fp8_block_w8a8": "cutlass"}: vLLM's prebuilt CUTLASS block-scaled kernel for
block-FP8 layers, every other layer as vLLM picks it. The block-FP8 engine figures (runs 11-16) ran that kernel.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Mapping

QUANT_SCHEME = "fp8_block_w8a8"  # vLLM's key for block-FP8 linear layers (model_executor/kernels/linear)
BACKEND = "cutlass"
# What the user may set that chooses the block-FP8 linear kernel themselves.
USER_KEYS = ("linear_backend",)


def nvcc_path(env: Mapping[str, str]) -> Path | None:
    """nvcc where FlashInfer's and DeepGEMM's JIT look for it: PATH, then CUDA_HOME (or /usr/local/cuda)."""
    found = shutil.which("nvcc", path=env.get("PATH", ""))
    if found:
        return Path(found)
    home = Path(env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda") / "bin" / "nvcc"
    return home if home.is_file() else None


def kernel_config(entries: Mapping, env: Mapping[str, str], cpu_build: bool) -> tuple[str | None, str | None]:
    """The kernel config to hand vLLM (the user's own, with the block-FP8 backend added), or None to leave it as it
    is; and a note for the start log saying what was done, or why not. `entries`: the launcher's resolved settings."""
    if cpu_build or nvcc_path(env) or any(k in entries for k in USER_KEYS):
        return None, None
    user = entries.get("kernel_config")
    config: dict = {}
    if user is not None:
        try:
            config = json.loads(user.raw)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            return None, (f"kernel_config ({user.source}) is not a JSON object: block-FP8 linear layers are left to "
                          f"vLLM's choice, which compiles with nvcc (none on this host)")
        per_quant = config.get("linear_backend_per_quant") or {}
        if not isinstance(per_quant, dict) or "linear_backend" in config or QUANT_SCHEME in per_quant:
            return None, None  # the user's choice (vLLM names what is wrong with a malformed one)
        config["linear_backend_per_quant"] = {**per_quant, QUANT_SCHEME: BACKEND}
    else:
        config = {"linear_backend_per_quant": {QUANT_SCHEME: BACKEND}}
    return json.dumps(config), ("no nvcc on this host: block-FP8 linear layers, if the checkpoint has them, run "
                                "vLLM's prebuilt CUTLASS kernel instead of DeepGEMM's JIT (kernel_config "
                                "linear_backend_per_quant; OPTION_LINEAR_BACKEND chooses another)")
