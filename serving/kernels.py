"""The FP8 kernels the container runs, chosen by the launcher from the checkpoint's quantization config.

Where the user has not chosen, an FP8 checkpoint on the GPU build gets, whatever the host's toolkit:
- block FP8 (quantization_config.weight_block_size): vLLM's CUTLASS block-scaled kernel for the linear layers
  (`--linear-backend cutlass`; patch 0010's small-M Triton tier runs inside it where configs/ holds a file for the
  layer's shape) and the Triton fused-MoE kernel with the image's tuned configs (`--moe-backend triton`), expert
  parallelism included;
- per-tensor FP8: CUTLASS for the linear layers and Triton for the MoE layers (patch 0001's order, which
  fp8_moe_stock_order=true hands back to vLLM);
- DeepGEMM off (VLLM_USE_DEEP_GEMM=0), which also keeps vLLM's E8M0 activation scales off.
These are the kernels of the engine figures (docs/performance.md). vLLM left to itself probes the host instead: with
an nvcc it finds, it puts FlashInfer's blockscale GEMM (block-FP8 linear layers), DeepGEMM, and under expert
parallelism FlashInfer's CUTLASS MoE first, each compiled with nvcc while the engine starts.

Those JIT-compiled kernels are opt-in: a linear or MoE backend the user names (OPTION_LINEAR_BACKEND,
OPTION_MOE_BACKEND, their SM_VLLM_ forms, kernel_config's keys), or VLLM_USE_DEEP_GEMM=1 (DeepGEMM for a block-FP8
checkpoint's linear and MoE layers). Each gets a start-log line saying it compiles with nvcc at start. Whether an
nvcc is usable is decided by the rule that JIT itself applies (deep_gemm_nvcc, flashinfer_nvcc); a JIT backend
chosen where its rule finds none stops the start at once with one line.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .resolve import ConfigError, ContextDefault

LINEAR = "linear_backend"
MOE = "moe_backend"
DEEP_GEMM_ENV = "VLLM_USE_DEEP_GEMM"
DG_COMPILER_ENV = "DG_JIT_NVCC_COMPILER"             # DeepGEMM's own choice of compiler
FLASHINFER_DG_COMPILER_ENV = "TRTLLM_DG_NVCC_COMPILER"  # that of FlashInfer's blockscale GEMM runtime
DEFAULT_CUDA_HOME = "/usr/local/cuda"

BLOCK, TENSOR = "block", "tensor"
NOTE = "FP8 kernels"  # the start-log lines of this module begin so


def fp8_format(config: Mapping | None) -> str | None:
    """"block" or "tensor" for a checkpoint whose config.json names FP8 (quant_method fp8), else None."""
    q = (config or {}).get("quantization_config")
    if not isinstance(q, Mapping) or str(q.get("quant_method", "")).lower() != "fp8":
        return None
    return BLOCK if q.get("weight_block_size") else TENSOR


def _executable(p: Path | str | None) -> Path | None:
    return Path(p) if p and os.path.isfile(p) and os.access(p, os.X_OK) else None


def _cuda_home(env: Mapping[str, str]) -> str:
    """The CUDA folder as DeepGEMM's and FlashInfer's JITs find it: CUDA_HOME or CUDA_PATH, else the
    folder above the nvcc on PATH, else /usr/local/cuda."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        return home
    found = shutil.which("nvcc", path=env.get("PATH", ""))
    return os.path.dirname(os.path.dirname(found)) if found else DEFAULT_CUDA_HOME


def deep_gemm_nvcc(env: Mapping[str, str]) -> Path | None:
    """The nvcc DeepGEMM's JIT runs (vLLM's vendored DeepGEMM, its CUDA backend): DG_JIT_NVCC_COMPILER, else bin/nvcc
    of the CUDA folder (_cuda_home), which must exist either way (its headers). None where that fails."""
    home = _cuda_home(env)
    if not os.path.isdir(home):
        return None
    given = env.get(DG_COMPILER_ENV)
    return _executable(given) if given else _executable(Path(home) / "bin" / "nvcc")


def flashinfer_nvcc(env: Mapping[str, str], gemm_runtime: bool = False) -> Path | None:
    """The nvcc FlashInfer's JIT runs: its module builds run bin/nvcc of the CUDA folder it finds (_cuda_home); its
    blockscale GEMM (gemm_runtime) also compiles kernels while serving with TRTLLM_DG_NVCC_COMPILER, else
    $CUDA_HOME/bin/nvcc, else `nvcc` from PATH. None where one it needs is missing."""
    build = _executable(Path(_cuda_home(env)) / "bin" / "nvcc")
    if build is None or not gemm_runtime:
        return build
    given = env.get(FLASHINFER_DG_COMPILER_ENV)
    if given:
        return _executable(given) and build
    if env.get("CUDA_HOME"):
        return _executable(Path(env["CUDA_HOME"]) / "bin" / "nvcc") and build
    return build if shutil.which("nvcc", path=env.get("PATH", "")) else None


# The JIT-compiled backends: (what compiles, the rule's function and its argument, how long its start compile took
# where measured).
DEEP_GEMM = ("DeepGEMM", lambda env: deep_gemm_nvcc(env),
             "its warm-up of 512 shapes took 42-48 minutes on an H200 by its own estimate")
FLASHINFER_GEMM = ("FlashInfer's blockscale GEMM", lambda env: flashinfer_nvcc(env, gemm_runtime=True),
                   "not measured here")
FLASHINFER_MOE = ("FlashInfer's CUTLASS MoE", lambda env: flashinfer_nvcc(env),
                  "its fused_moe_90 module took over 12 minutes on an H200")
JIT = {(LINEAR, "deep_gemm"): DEEP_GEMM, (MOE, "deep_gemm"): DEEP_GEMM,
       (LINEAR, "flashinfer_cutlass"): FLASHINFER_GEMM, (MOE, "flashinfer_cutlass"): FLASHINFER_MOE}


@dataclass
class KernelPlan:
    defaults: list[ContextDefault] = field(default_factory=list)  # linear and MoE backends the launcher sets
    env: dict[str, str] = field(default_factory=dict)             # added to the engine's environment
    notes: list[str] = field(default_factory=list)                # start-log lines


def _user_choice(key: str, entries: Mapping) -> tuple[str, str] | None:
    """(value, source) of a backend the user chose, as a setting or inside kernel_config."""
    r = entries.get(key)
    if r is not None:
        return str(r.raw).strip().lower().replace("-", "_"), r.source
    kc = entries.get("kernel_config")
    if kc is not None:
        try:
            config = json.loads(kc.raw)
        except ValueError:
            return None  # vLLM's parser refuses it, naming the setting
        if isinstance(config, dict) and config.get(key) is not None:
            return str(config[key]).lower().replace("-", "_"), kc.source
    return None


def _flag(raw: str | None) -> bool | None:
    if raw is None or not raw.strip():
        return None
    try:
        return bool(int(raw))  # as vLLM's envs.py reads it
    except ValueError:
        raise ConfigError(DEEP_GEMM_ENV, f"env {DEEP_GEMM_ENV}",
                          f"{raw!r} is not an integer (vLLM reads 0 or 1)") from None


def plan(config: Mapping | None, entries: Mapping, env: Mapping[str, str], cpu_build: bool,
         stock_order: bool = False) -> KernelPlan:
    """The kernel defaults, engine environment and start-log lines for a checkpoint of `config` (config.json),
    given the user's settings (`entries`) and the launcher's environment. Raises ConfigError where a chosen
    JIT-compiled backend finds no nvcc by its own rule."""
    out = KernelPlan()
    if cpu_build:
        return out
    fmt = fp8_format(config)
    deep_gemm = _flag(env.get(DEEP_GEMM_ENV))
    if deep_gemm is None:
        out.env[DEEP_GEMM_ENV] = "0"
    chosen = {key: _user_choice(key, entries) for key in (LINEAR, MOE)}
    if fmt is not None:
        if deep_gemm and fmt == BLOCK:
            why = f"{DEEP_GEMM_ENV}=1: DeepGEMM for block FP8"
            measured = {LINEAR: ("deep_gemm", why), MOE: ("deep_gemm", why)}
        else:
            what = "block FP8" if fmt == BLOCK else "per-tensor FP8"
            measured = {LINEAR: ("cutlass", f"{what}: the measured kernel, vLLM's CUTLASS"
                                 + (" with the small-M Triton tier" if fmt == BLOCK else "")),
                        MOE: ("triton", f"{what}: the measured kernel, Triton with the tuned configs")}
            if fmt == TENSOR and stock_order:
                del measured[MOE]  # fp8_moe_stock_order: vLLM's own order
        for key, (value, why) in measured.items():
            if chosen[key] is None:
                out.defaults.append(ContextDefault(key, value, why))
                chosen[key] = (value, f"default ({why})")
        shown = ", ".join(f"{k}={c[0]} ({c[1]})" if c else f"{k}: vLLM's choice" for k, c in chosen.items())
        out.notes.append(f"{NOTE}: {'block' if fmt == BLOCK else 'per-tensor'} FP8 checkpoint: {shown}")
    jits: dict[tuple, list[tuple[str, str, str]]] = {}  # JIT -> (key, value, source) that choose it
    for key, choice in chosen.items():
        if choice is not None and (key, choice[0]) in JIT:
            jits.setdefault(JIT[key, choice[0]], []).append((key, *choice))
    for (name, rule, took), by in jits.items():
        nvcc = rule(env)
        if nvcc is None:
            key, value, source = by[0]
            raise ConfigError(key, source, f"{value}: {name} compiles its kernels with nvcc at start, and its JIT "
                              f"finds none on this host ({_rule_text(name)}); choose cutlass or triton, or give it "
                              "an nvcc")
        keys = ", ".join(f"{k}={v} from {s}" for k, v, s in by)
        out.notes.append(f"{NOTE}: {name} ({keys}) compiles its kernels with nvcc at start ({nvcc}): {took}")
    return out


def _rule_text(name: str) -> str:
    if name == DEEP_GEMM[0]:
        return f"{DG_COMPILER_ENV}, else bin/nvcc under CUDA_HOME, CUDA_PATH, the nvcc on PATH's folder or " \
               f"{DEFAULT_CUDA_HOME}"
    if name == FLASHINFER_GEMM[0]:
        return f"bin/nvcc under CUDA_HOME, CUDA_PATH, the nvcc on PATH's folder or {DEFAULT_CUDA_HOME}, and " \
               f"{FLASHINFER_DG_COMPILER_ENV}, else $CUDA_HOME/bin/nvcc, else nvcc on PATH"
    return f"bin/nvcc under CUDA_HOME, CUDA_PATH, the nvcc on PATH's folder or {DEFAULT_CUDA_HOME}"
