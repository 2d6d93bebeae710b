"""What a tuned fused-MoE config file means to vLLM 0.32 (with the project's series).

One home for the config semantics that the patch tool (apply.py) checks
configs with and that the H200 harness (bench/kernels/moe/) times kernels with:

* the file name vLLM looks up and the folders it searches (``config_file_name``,
  ``get_moe_configs``), and how it reads a file (``load_config_file``);
* the entry vLLM picks for a batch of M tokens (``nearest_config``, the rule of
  ``try_get_optimal_moe_config``);
* the config of one GEMM of an entry (``gemm_config``, as patch 0003's
  ``try_get_optimal_moe_gemm_configs`` resolves its optional ``w13``/``w2`` dicts);
* swap-AB (vllm PR #36559, upstream since 0.25): vLLM's own ``enable_swap_ab`` read
  from the target's source, and the check that it fires for the decode batch sizes
  of the H200 FP8 configs (``verify_swap_ab``).

Standard library only: the patch tool runs in the image build before anything
imports vLLM.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

# Decode batch sizes (tokens per MoE call) for which swap-AB must fire.
DEFAULT_DECODE_MAX = 32
# Swap-AB's fused-MoE configs: vLLM maps every H200 variant to this name.
H200_FP8_CONFIG_GLOB = "E=*,N=*,device_name=NVIDIA_H200,dtype=fp8_w8a8*.json"
# The per-GEMM dicts an entry may hold (patch 0003).
GEMM_NAMES = ("w13", "w2")
# The key of patch 0011's matrix-vector kernel config inside a per-GEMM dict: not a tile config of the GEMM.
GEMV_KEY = "GEMV"

# Where vLLM keeps swap-AB's rule and its call (paths as in the patches: "vllm/...").
MOE_UTILS = "vllm/model_executor/layers/fused_moe/utils.py"
FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"

# A reader of the target's source: "vllm/..." path -> text.
SourceReader = Callable[[str], str]


class MoEConfigError(Exception):
    """A config file, or the vLLM source it is checked against, is not as expected."""


# --------------------------------------------------------------------------
# Files and lookup (fused_moe.py get_config_file_name / get_moe_configs /
# try_get_optimal_moe_config)
# --------------------------------------------------------------------------


def config_file_name(E: int, N: int, block=None, device_name="NVIDIA_H200", dtype="fp8_w8a8") -> str:
    bs = "" if not block or not all(block) else f",block_shape={list(block)}".replace(" ", "")
    return f"E={E},N={N},device_name={device_name},dtype={dtype}{bs}.json"


def load_config_file(path: str | Path) -> dict[int, dict]:
    with open(path) as f:
        d = json.load(f)
    d.pop("triton_version", None)
    return {int(k): v for k, v in d.items()}


def get_moe_configs(E, N, block, folders) -> tuple[dict[int, dict] | None, str | None]:
    """The first of `folders` holding the shape's file (vLLM: the tuned folder, then its own)."""
    name = config_file_name(E, N, block)
    for folder in folders:
        if folder is None:
            continue
        p = os.path.join(folder, name)
        if os.path.exists(p):
            return load_config_file(p), p
    return None, None


def nearest_config(configs: dict[int, dict], m: int) -> tuple[int, dict]:
    # Same rule as vLLM's try_get_optimal_moe_config.
    key = min(configs.keys(), key=lambda x: abs(x - m))
    return key, configs[key]


def gemm_config(entry: dict, gemm: str) -> dict:
    """One GEMM's config of a tuned entry, as patch 0003's
    try_get_optimal_moe_gemm_configs resolves it."""
    flat = {k: v for k, v in entry.items() if k not in GEMM_NAMES}
    return {**flat, **entry.get(gemm, {})}


# --------------------------------------------------------------------------
# Swap-AB: upstream (vllm PR #36559), verified, not patched
# --------------------------------------------------------------------------


def find_function(tree_ast: ast.AST, name: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(tree_ast)
             if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) != 1:
        raise MoEConfigError(f"expected one function {name}, found {len(found)}")
    return found[0]


class _CudaCapability:
    """Just enough of a CUDA platform to evaluate vLLM's enable_swap_ab."""

    def __init__(self, capability: int):
        self.capability = capability

    def is_cuda(self) -> bool:
        return True

    def is_device_capability(self, capability: int) -> bool:
        return self.capability == capability

    def has_device_capability(self, capability: int) -> bool:
        return self.capability >= capability


def load_enable_swap_ab(source: SourceReader, capability: int) -> Callable[[int, int], bool]:
    """vLLM's own enable_swap_ab, compiled from the target's source and bound
    to a platform of the given capability (no torch/vLLM import needed)."""
    fn = find_function(ast.parse(source(MOE_UTILS)), "enable_swap_ab")
    fn.decorator_list = []  # drop functools.lru_cache
    module = ast.Module(body=[fn], type_ignores=[])
    namespace: dict = {"current_platform": _CudaCapability(capability)}
    exec(compile(module, MOE_UTILS, "exec"), namespace)
    return namespace["enable_swap_ab"]


def verify_swap_ab(source: SourceReader, configs_dir: Path | None,
                   decode_sizes: Iterable[int] = range(1, DEFAULT_DECODE_MAX + 1)
                   ) -> dict:
    """Swap-AB is in the target's source, its rule is vLLM's, and it fires for the
    decode sizes of each H200 FP8 config in `configs_dir`; returns the record's
    swap-AB part, raises MoEConfigError naming every problem."""
    decode_sizes = list(decode_sizes)
    problems = []
    for rel, pattern in (
        (MOE_UTILS, r"^def enable_swap_ab\("),
        # patch 0003 wraps the call in a per-GEMM SWAP_AB override: "SWAP_AB = (\n enable_swap_ab(...)"
        (FUSED_MOE, r"if use_fp8_w8a8:\n\s+SWAP_AB = \(?\s*enable_swap_ab\("
                    r"config\[\"BLOCK_SIZE_M\"\], config\[\"BLOCK_SIZE_N\"\]\)"),
        (FUSED_MOE, r"SWAP_AB=SWAP_AB,"),
    ):
        if not re.search(pattern, source(rel), re.MULTILINE):
            problems.append(f"swap-AB (vllm PR #36559) missing: {rel} lacks /{pattern}/")
    if problems:
        raise MoEConfigError("\n".join(problems))

    hopper = load_enable_swap_ab(source, 90)
    # The rule itself: fires for small M blocks on 9.0 only.
    expect = {(90, 16, 128): True, (90, 64, 128): False, (90, 16, 32): False,
              (100, 16, 128): False, (89, 16, 128): False}
    for (cap, bm, bn), want in expect.items():
        got = load_enable_swap_ab(source, cap)(bm, bn) if cap != 90 else hopper(bm, bn)
        if got != want:
            problems.append(
                f"enable_swap_ab(BLOCK_SIZE_M={bm}, BLOCK_SIZE_N={bn}) on "
                f"capability {cap / 10:.1f} is {got}, expected {want}")

    checked, fired = [], {}
    files = sorted(configs_dir.glob(H200_FP8_CONFIG_GLOB)) if (
        configs_dir and configs_dir.is_dir()) else []
    for cfg_file in files:
        try:
            configs = load_config_file(cfg_file)
        except (ValueError, AttributeError) as e:
            problems.append(f"{cfg_file.name}: not a fused-MoE config JSON ({e})")
            continue
        # Checked on w13, the decode GEMM swap-AB was made for, with the entry's
        # per-GEMM keys (patch 0003). A decode entry with BLOCK_SIZE_M >= 64 wastes most
        # of each 64-row wgmma (the waste swap-AB exists to remove), and a w13 with
        # swap-AB forced off gives the gain away: both are errors. An entry with a narrow
        # N tile (BLOCK_SIZE_N < 64) is a tuner's measured choice where swap-AB does not
        # apply (the H200 sweep found equal times with the swap forced on): allowed and
        # recorded, as long as swap-AB fires for some decode sizes of the file. Where it
        # fires for w2 is recorded (the tuner may turn it off there: measured faster).
        wide_m, fires, narrow_n, w2_fires = [], [], [], []
        for m in decode_sizes:
            key, entry = nearest_config(configs, m)
            w13, w2 = (gemm_config(entry, g) for g in GEMM_NAMES)
            bm, bn = w13["BLOCK_SIZE_M"], w13["BLOCK_SIZE_N"]
            if w2.get("SWAP_AB", hopper(w2["BLOCK_SIZE_M"], w2["BLOCK_SIZE_N"])):
                w2_fires.append(m)
            if w13.get("SWAP_AB", hopper(bm, bn)):
                fires.append(m)
            elif bm >= 64:
                wide_m.append(f"M={m} (entry {key}: BLOCK_SIZE_M={bm}, BLOCK_SIZE_N={bn})")
            elif "SWAP_AB" in w13 and bn >= 64:
                wide_m.append(f"M={m} (entry {key}: w13 SWAP_AB=false)")
            else:
                narrow_n.append(m)
        if wide_m or not fires:
            problems.append(
                f"swap-AB does not fire for {cfg_file.name} at " + ", ".join(
                    wide_m or [f"any decode size M={min(decode_sizes)}..{max(decode_sizes)}"])
                + "; it needs BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64")
        fired[cfg_file.name] = {"fires_at": _ranges(fires), "narrow_n_tile_at": _ranges(narrow_n),
                                "w2_fires_at": _ranges(w2_fires)}
        checked.append(cfg_file.name)
    if problems:
        raise MoEConfigError("\n".join(problems))
    return {
        "upstream": "vllm PR #36559 (0.25.0)",
        "present": True,
        "decode_batch_sizes": [min(decode_sizes), max(decode_sizes)],
        "configs_dir": str(configs_dir) if configs_dir else None,
        "configs_checked": checked,
        "per_config": fired,
    }


def _ranges(ms: list[int]) -> str:
    """[1, 2, 3, 8] -> "1-3,8" (compact for the record and the log)."""
    out, start = [], None
    for i, m in enumerate(ms):
        if start is None:
            start = m
        if i + 1 == len(ms) or ms[i + 1] != m + 1:
            out.append(str(start) if start == m else f"{start}-{m}")
            start = None
    return ",".join(out)
