"""DeepGEMM off on a GPU host where its JIT finds no nvcc, run by the launcher.

Qwen's and DeepSeek's official FP8 checkpoints are block FP8 (weight_block_size [128, 128]). vLLM 0.32 on Hopper
gives their linear layers FlashInfer's DeepGEMM kernel, else DeepGEMM, and under expert parallelism their MoE layers
FlashInfer CUTLASS, else DeepGEMM, else Triton. FlashInfer and DeepGEMM both compile their kernels with nvcc when
the engine starts (on an H200 with nvcc: FlashInfer's fp8_blockscale_gemm_90 build and DeepGEMM's warm-up over 512
shapes, 42-48 minutes by its own estimate; bench/RESULTS-archive.md, run 2). vLLM turns FlashInfer off by itself
where it finds no nvcc (`vllm.utils.flashinfer.has_flashinfer`), but not DeepGEMM, whose JIT would then fail the
start; the image's runtime base has no nvcc on its paths.

So where neither nvcc nor DeepGEMM's own `DG_JIT_NVCC_COMPILER` is found and the user left `VLLM_USE_DEEP_GEMM`
unset, the launcher sets it to 0: block-FP8 linear layers run vLLM's prebuilt CUTLASS block-scaled kernel, and
block-FP8 MoE layers under expert parallelism run Triton with the image's tuned configs: the kernels of the
block-FP8 engine figures (runs 11-16, one rank at TP=1; expert parallelism itself is not measured).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

ENV = "VLLM_USE_DEEP_GEMM"
COMPILER_ENV = "DG_JIT_NVCC_COMPILER"  # DeepGEMM's own choice of compiler


def nvcc_path(env: Mapping[str, str]) -> Path | None:
    """The nvcc DeepGEMM's JIT would run: DG_JIT_NVCC_COMPILER, else PATH, else CUDA_HOME (or /usr/local/cuda)."""
    given = env.get(COMPILER_ENV)
    if given:
        return Path(given) if os.access(given, os.X_OK) else None
    found = shutil.which("nvcc", path=env.get("PATH", ""))
    if found:
        return Path(found)
    home = Path(env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda") / "bin" / "nvcc"
    return home if home.is_file() else None


def engine_env(env: Mapping[str, str], cpu_build: bool) -> tuple[dict[str, str], str | None]:
    """What to add to the engine's environment, and a note for the start log saying so."""
    if cpu_build or ENV in env or nvcc_path(env):
        return {}, None
    return {ENV: "0"}, (f"no nvcc on this host for DeepGEMM's JIT: {ENV}=0, so block-FP8 linear layers run vLLM's "
                        f"prebuilt CUTLASS kernel and block-FP8 MoE layers under expert parallelism run Triton "
                        f"(set {ENV}=1 and {COMPILER_ENV} to an nvcc for DeepGEMM)")


# The nvcc that the image's runtime itself carries (the nvidia-cuda-nvcc wheel, which cuda-toolkit and tilelang
# require), under site-packages/nvidia/cu13/bin, which neither PATH nor CUDA_HOME names. It is newer (13.5) than the
# runtime's CUDA headers (13.0), which CCCL refuses without CCCL_FLAG (bench/RESULTS-archive.md, run 35).
CCCL_FLAG = "-DCCCL_DISABLE_CTK_COMPATIBILITY_CHECK"


def runtime_nvcc(site_packages: Path) -> Path | None:
    """The runtime's own nvcc under site_packages, or None where its wheel is not installed (the CPU build)."""
    nvcc = site_packages / "nvidia" / "cu13" / "bin" / "nvcc"
    return nvcc if os.access(nvcc, os.X_OK) else None


# DeepGEMM's JIT takes its headers from CUDA_HOME, else from the nvcc on PATH, else from /usr/local/cuda, never from
# the folder of the compiler it was given: so the runtime's nvcc needs CUDA_HOME set to the folder it comes in
# (bin/, include/ with cccl/, lib/), or a host's own toolkit of another version lends the headers.
def runtime_cuda_home(nvcc: Path) -> Path:
    """The CUDA folder of the runtime's nvcc (site-packages/nvidia/cu13)."""
    return nvcc.parent.parent
