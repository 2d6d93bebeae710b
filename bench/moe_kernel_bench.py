#!/usr/bin/env python3
"""H200 benchmark / tuning / JIT-count harness for vLLM 0.32's Triton fused-MoE
FP8 kernel (``fused_moe_kernel``), run WITHOUT importing vLLM.

The kernel source is taken from a vLLM ``fused_moe.py`` given by path (pristine
or patched): ``fused_moe_kernel`` and the jit helpers it calls are cut out with
``ast`` and written to a generated module (Triton needs real source files), so
the kernel that runs is byte-for-byte vLLM's.  Everything around it is ours and
mirrors vLLM 0.32:

* ``moe_align_block_size_torch``  -- torch version of vLLM's CUDA op (same
  buffer sizes, same padding value ``numel``, same block->expert layout).
* ``prepare_assignment``           -- ``_prepare_expert_assignment`` (naive
  block assignment when ``M*top_k*4 <= E``).
* ``invoke``                       -- ``invoke_fused_moe_triton_kernel`` for
  fp8 w8a8, per-tensor scales or [128,128] block scales; swap-AB decided like
  ``enable_swap_ab`` (capability 9.0, BM < 64, BN >= 64) unless overridden.
* ``get_moe_configs`` / ``try_get_config`` / ``get_default_config`` -- config
  lookup as vLLM (tuned-folder first, then vLLM's own configs/, nearest key,
  else the fp8 default), ONE config per M shared by w13 and w2.

Modes: smoke, bench, tune, jit (see --help).  Every configuration is checked
against a float32 reference on random inputs (outputs poisoned with NaN first).
Timing: CUDA graph of launches over rotated input sets (weights too) so L2 does
not serve repeats; median over replays.  Bench mode also records CUPTI kernel
times (torch.profiler) when available.  Floor = bytes the routed tokens touch
(fp8 expert weights + activations + bf16 outputs) / copy bandwidth measured in
the same run.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

# vLLM's config files, lookup and nearest-entry rule, and patch 0003's per-GEMM resolution: the
# copies serving/patch_series.py checks configs with
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serving.moe_configs import (config_file_name, gemm_config, get_moe_configs,  # noqa: E402,F401
                                 load_config_file, nearest_config)

try:  # the config-lookup helpers (and the CPU tests that use them) need no torch
    import torch
except ImportError:  # pragma: no cover
    torch = None

# ----------------------------------------------------------------------------
# shapes (N = moe intermediate size per rank, the vLLM config-file N; the w13
# GEMM outputs 2N, the w2 GEMM reduces over N)
# ----------------------------------------------------------------------------
SHAPES = {
    "qwen3-235b-tp8": dict(E=128, topk=8, H=4096, N=192, block=None),
    "qwen3-coder-480b-tp8": dict(E=160, topk=8, H=6144, N=320, block=None),
    "mixtral-8x7b-tp8": dict(E=8, topk=2, H=4096, N=1792, block=None),
    "deepseek-v3-tp8": dict(E=256, topk=8, H=7168, N=256, block=[128, 128]),
    "qwen3-30b-a3b-tp1": dict(E=128, topk=8, H=2048, N=768, block=None),
}
TP8_SHAPES = ["qwen3-235b-tp8", "qwen3-coder-480b-tp8", "mixtral-8x7b-tp8", "deepseek-v3-tp8"]
# vLLM benchmarks/kernels/benchmark_moe.py batch sizes
TUNER_MS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
L2_BYTES = 60 * 1024 * 1024
CFG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# a config entry's per-GEMM dicts (patch 0003)
GEMM_NAMES = ("w13", "w2")

# ----------------------------------------------------------------------------
# kernel loading (no vLLM import)
# ----------------------------------------------------------------------------
_KERNEL_NAMES = ("write_zeros_to_output", "fused_moe_kernel")
# patch 0004 (fused_moe_kernel_split_k): the kernel, vLLM's own launcher for
# it and its workspace, taken when the given file has them
_SPLIT_K_NAMES = ("fused_moe_kernel_split_k", "_invoke_fused_moe_kernel_split_k", "_split_k_workspace",
                  "_SPLIT_K_WORKSPACES", "_SPLIT_K_MAX_WORKSPACE_BYTES")
_GENERATED_HEADER = """import logging

import torch
import triton
import triton.language as tl


class _Logger(logging.LoggerAdapter):
    def warning_once(self, msg, *args):
        if msg not in _WARNED:
            _WARNED.add(msg)
            self.warning(msg, *args)


_WARNED = set()
logger = _Logger(logging.getLogger("moe_bench"), {})


"""


def _top_level_name(node) -> str | None:
    if isinstance(node, ast.FunctionDef):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def extract_kernel_source(fused_moe_py: str) -> str:
    src = Path(fused_moe_py).read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    parts = []
    found = set()
    for node in tree.body:
        name = _top_level_name(node)
        if name in _KERNEL_NAMES or name in _SPLIT_K_NAMES:
            decos = getattr(node, "decorator_list", [])
            start = min([d.lineno for d in decos] + [node.lineno]) - 1
            parts.append("".join(lines[start:node.end_lineno]))
            found.add(name)
    missing = set(_KERNEL_NAMES) - found
    if missing:
        raise RuntimeError(f"{fused_moe_py}: kernel functions not found: {sorted(missing)}")
    if found & set(_SPLIT_K_NAMES) and not set(_SPLIT_K_NAMES) <= found:
        raise RuntimeError(f"{fused_moe_py}: only part of the split-K kernel found: "
                           f"{sorted(found & set(_SPLIT_K_NAMES))}")
    header = "# generated by bench/moe_kernel_bench.py from " + os.path.basename(fused_moe_py) + "\n"
    return header + _GENERATED_HEADER + "\n\n".join(parts)


def load_kernel(fused_moe_py: str, tag: str):
    """Return (module, source_sha) of the generated kernel module."""
    import importlib.util

    code = extract_kernel_source(fused_moe_py)
    sha = hashlib.sha256(code.encode()).hexdigest()[:12]
    gen_dir = Path(os.environ.get("MOE_BENCH_GEN_DIR", os.path.join(tempfile.gettempdir(), "moe_bench_gen")))
    gen_dir.mkdir(parents=True, exist_ok=True)
    path = gen_dir / f"moe_kernel_{sha}.py"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(code)
        os.replace(tmp, path)
    modname = f"moe_kernel_{sha}"
    if modname in sys.modules:
        return sys.modules[modname], sha
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    mod.SOURCE_TAG = tag
    return mod, sha


def kernel_decorator_text(fused_moe_py: str) -> str:
    src = Path(fused_moe_py).read_text()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == "fused_moe_kernel":
            return "; ".join(ast.unparse(d) for d in node.decorator_list)
    return "?"


# ----------------------------------------------------------------------------
# vLLM config lookup (fused_moe.py get_config_file_name / get_moe_configs /
# try_get_optimal_moe_config / get_default_config, CUDA branch)
# ----------------------------------------------------------------------------
def get_default_config(M, E, N, K, topk, dtype="fp8_w8a8", block=None) -> dict:
    if dtype == "fp8_w8a8" and block is not None:
        if M <= 8 and block[0] % 64 == 0:
            block_n = 64
            num_stages = 4 if M <= 4 else 3
        else:
            block_n = block[0]
            num_stages = 3
        return {
            "BLOCK_SIZE_M": 16 if M <= 64 else 64,
            "BLOCK_SIZE_N": block_n,
            "BLOCK_SIZE_K": block[1],
            "GROUP_SIZE_M": 1 if M <= 16 else 32,
            "num_warps": 4,
            "num_stages": num_stages,
        }
    if M <= 32:
        block_m = 16
    elif M <= 96:
        block_m = 32
    elif M <= 512:
        block_m = 64
    else:
        block_m = 128
    block_n = 64 if M <= 64 else 128
    block_k = 128 if dtype == "fp8_w8a8" or M <= 64 else 64
    group_m = 16 if M // max(E, 1) > 128 else 1
    num_warps = 4 if M <= 128 else 8
    num_stages = 4 if M <= 32 else 3
    return {
        "BLOCK_SIZE_M": block_m,
        "BLOCK_SIZE_N": block_n,
        "BLOCK_SIZE_K": block_k,
        "GROUP_SIZE_M": group_m,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


def try_get_config(shape: dict, M: int, folders) -> tuple[dict, str]:
    """(config, source) as vLLM 0.32 picks it for this M."""
    configs, path = get_moe_configs(shape["E"], shape["N"], shape["block"], folders)
    if configs:
        key, entry = nearest_config(configs, M)
        return dict(entry), f"file:{os.path.basename(os.path.dirname(path))}[{key}]"
    return (
        get_default_config(M, shape["E"], shape["N"], shape["H"], shape["topk"], "fp8_w8a8", shape["block"]),
        "default",
    )


def cfg_str(c: dict) -> str:
    """One GEMM's config, e.g. M16N64K256G1w4s6 (+ k4: SPLIT_K, x0/x1: SWAP_AB forced)."""
    out = "M{BLOCK_SIZE_M}N{BLOCK_SIZE_N}K{BLOCK_SIZE_K}G{GROUP_SIZE_M}w{num_warps}s{num_stages}".format(**c)
    if c.get("SPLIT_K", 1) > 1:
        out += f"k{c['SPLIT_K']}"
    if "SWAP_AB" in c:
        out += f"x{int(bool(c['SWAP_AB']))}"
    return out


def cfg_clean(c: dict) -> dict:
    out = {k: int(c[k]) for k in CFG_KEYS}
    if c.get("SPLIT_K", 1) > 1:
        out["SPLIT_K"] = int(c["SPLIT_K"])
    if "SWAP_AB" in c:
        out["SWAP_AB"] = bool(c["SWAP_AB"])
    return out


def entry_str(entry: dict) -> str:
    if not any(g in entry for g in GEMM_NAMES):
        return cfg_str(entry)
    return " / ".join(f"{g} {cfg_str(gemm_config(entry, g))}" for g in GEMM_NAMES)


def make_entry(c13: dict, c2: dict) -> dict:
    """A config-file entry for a (w13, w2) pair with equal BLOCK_SIZE_M: the
    w13 config flat (what unpatched vLLM would run for both) plus the keys
    that differ, per GEMM."""
    assert c13["BLOCK_SIZE_M"] == c2["BLOCK_SIZE_M"]
    a, b = cfg_clean(c13), cfg_clean(c2)
    flat = {k: a[k] for k in CFG_KEYS}
    entry = dict(flat)
    for g, c in (("w13", a), ("w2", b)):
        d = {k: v for k, v in c.items() if flat.get(k) != v}
        if d:
            entry[g] = d
    return entry


# ----------------------------------------------------------------------------
# moe_align_block_size (torch) and vLLM's expert assignment
# ----------------------------------------------------------------------------
def moe_align_block_size_torch(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    dev = topk_ids.device
    numel = topk_ids.numel()
    max_num_tokens_padded = numel + num_experts * (block_size - 1)
    if numel < num_experts:
        max_num_tokens_padded = min(numel * block_size, max_num_tokens_padded)
    max_num_m_blocks = -(-max_num_tokens_padded // block_size)
    flat = topk_ids.reshape(-1).to(torch.int64)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    pad_off = torch.cumsum(padded, 0) - padded  # exclusive
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    cnt_off = torch.cumsum(counts, 0) - counts
    rank = torch.arange(numel, device=dev) - cnt_off[sorted_e]
    dest = pad_off[sorted_e] + rank
    sorted_ids = torch.full((max_num_tokens_padded,), numel, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    nblk = padded // block_size
    blk_expert = torch.repeat_interleave(torch.arange(num_experts, device=dev), nblk)
    expert_ids = torch.zeros((max_num_m_blocks,), dtype=torch.int32, device=dev)
    expert_ids[: blk_expert.numel()] = blk_expert.to(torch.int32)
    ntpp = padded.sum().reshape(1).to(torch.int32)
    return sorted_ids, expert_ids, ntpp


def prepare_assignment(topk_ids, BM, E, M, topk):
    """vLLM 0.32 _prepare_expert_assignment (no expert_map)."""
    if M * topk * 4 <= E:
        return (
            None,
            topk_ids.reshape(-1),
            torch.full((1,), topk_ids.numel() * BM, dtype=torch.int32, device=topk_ids.device),
        )
    return moe_align_block_size_torch(topk_ids, BM, E)


def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def enable_swap_ab(BM, BN) -> bool:
    return is_hopper() and BM < 64 and BN >= 64


def swap_of(config: dict, swap_ab=None) -> bool:
    """swap-AB as the patched launcher decides: forced by the caller, else the
    config's SWAP_AB key (patch 0003), else vLLM's rule."""
    if swap_ab is not None:
        return bool(swap_ab)
    if "SWAP_AB" in config:
        return bool(config["SWAP_AB"])
    return enable_swap_ab(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"])


class _WarmupOnly:
    """Stands in for a jit kernel: kernel[grid](...) compiles, launches nothing."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *a, **k: self.kernel.warmup(*a, grid=grid, **k)


def invoke(kmod, A, B, C, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, ntpp,
           mul_routed_weight, top_k, config, block_shape, compute_type=None, swap_ab=None, warmup=False):
    """invoke_fused_moe_triton_kernel (vLLM 0.32) for fp8 w8a8."""
    import triton
    import triton.language as tl

    if compute_type is None:
        compute_type = tl.bfloat16 if C.dtype == torch.bfloat16 else tl.float32
    SWAP_AB = swap_of(config, swap_ab)
    if block_shape is not None:
        assert triton.cdiv(B.size(-2), block_shape[0]) == B_scale.size(-2)
        assert triton.cdiv(B.size(-1), block_shape[1]) == B_scale.size(-1)
    M = A.size(0)
    num_tokens = M * top_k
    if sorted_ids is not None:
        EM = sorted_ids.size(0)
        if A.size(0) < config["BLOCK_SIZE_M"]:
            EM = min(sorted_ids.size(0), A.size(0) * top_k * config["BLOCK_SIZE_M"])
    else:
        EM = num_tokens * config["BLOCK_SIZE_M"]
    cfg = {k: config[k] for k in CFG_KEYS}
    cfg["SPLIT_K"] = 1
    BLOCK_SIZE_K = cfg.pop("BLOCK_SIZE_K")
    if block_shape is not None:
        BLOCK_SIZE_K = min(BLOCK_SIZE_K, min(block_shape[0], block_shape[1]))
    grid = (triton.cdiv(EM, cfg["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), cfg["BLOCK_SIZE_N"]),)
    if A_scale is not None and A_scale.ndim == 0:
        A_scale = A_scale.reshape(1)
    split_k = config.get("SPLIT_K", 1)
    if split_k > 1:
        # patch 0004: vLLM's own launcher of fused_moe_kernel_split_k
        if not hasattr(kmod, "_invoke_fused_moe_kernel_split_k"):
            raise RuntimeError(f"{cfg_str(config)} needs fused_moe_kernel_split_k (patch 0004) in the kernel source")
        real = kmod.fused_moe_kernel_split_k
        if warmup:
            kmod.fused_moe_kernel_split_k = _WarmupOnly(real)
        try:
            if kmod._invoke_fused_moe_kernel_split_k(
                A, B, C, None, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, ntpp, EM, num_tokens,
                mul_routed_weight, top_k, compute_type, True, False, block_shape, SWAP_AB, BLOCK_SIZE_K,
                split_k, cfg,
            ):
                return
        finally:
            kmod.fused_moe_kernel_split_k = real
    kfn = kmod.fused_moe_kernel[grid] if not warmup else _WarmupOnly(kmod.fused_moe_kernel)[grid]
    kfn(
        A, B, C, None, A_scale, B_scale, topk_weights, sorted_ids, expert_ids, ntpp,
        B.size(1), B.size(2), EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),
        A_scale.stride(0) if A_scale is not None and A_scale.ndim == 2 else 0,
        A_scale.stride(1) if A_scale is not None and A_scale.ndim == 2 else 0,
        B_scale.stride(0) if B_scale is not None and B_scale.ndim >= 2 else 0,
        B_scale.stride(2) if B_scale is not None and B_scale.ndim == 3 else 0,
        B_scale.stride(1) if B_scale is not None and B_scale.ndim >= 2 else 0,
        0, 0,
        0 if block_shape is None else block_shape[0],
        0 if block_shape is None else block_shape[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=compute_type,
        use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        naive_block_assignment=(sorted_ids is None), HAS_BIAS=False, BLOCK_SIZE_K=BLOCK_SIZE_K,
        SWAP_AB=SWAP_AB, USE_TD=False, **cfg,
    )


# ----------------------------------------------------------------------------
# problem data
# ----------------------------------------------------------------------------
def wdtype(dev):
    # the Triton interpreter (CPU tests) cannot hold fp8: use fp32 values there
    return torch.float8_e4m3fn if dev.type == "cuda" else torch.float32


def gemm_dims(shape, gemm):
    """(N_out, K_in) of the weight tensor B (E, N_out, K_in)."""
    if gemm == "w13":
        return 2 * shape["N"], shape["H"]
    return shape["H"], shape["N"]


class Weights:
    """n_sets copies of (B, B_scale) for one GEMM of one shape."""

    def __init__(self, shape, gemm, n_sets, dev, seed=0, random=True):
        E = shape["E"]
        Nout, K = gemm_dims(shape, gemm)
        g = torch.Generator(device=dev).manual_seed(seed)
        self.B, self.Bs = [], []
        for _ in range(n_sets):
            if random:
                b = torch.empty((E, Nout, K), device=dev, dtype=wdtype(dev))
                for e0 in range(0, E, 16):  # chunked: bounded fp32 temporaries
                    b[e0:e0 + 16] = torch.randn((min(16, E - e0), Nout, K), generator=g, device=dev).to(b.dtype)
            else:  # compile-only (worker processes): contents irrelevant
                b = torch.zeros((E, Nout, K), device=dev, dtype=wdtype(dev))
            self.B.append(b)
            if shape["block"] is None:
                s = torch.rand((E,), generator=g, device=dev) * 0.01 + 0.005
            else:
                bn, bk = shape["block"]
                s = torch.rand((E, -(-Nout // bn), -(-K // bk)), generator=g, device=dev) * 0.01 + 0.005
            self.Bs.append(s)
        self.bytes_per_expert = Nout * K  # fp8


def dequant_w(B, Bs, block):
    Bf = B.float()
    if block is None:
        return Bf * Bs.view(-1, 1, 1)
    bn, bk = block
    s = Bs.repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)[:, : Bf.shape[1], : Bf.shape[2]]
    return Bf * s


def dequant_a(A, As, block):
    Af = A.float()
    if block is None:
        return Af * As.view(1, 1)
    bk = block[1]
    s = As.repeat_interleave(bk, dim=1)[:, : Af.shape[1]]
    return Af * s


class Inputs:
    """One routed batch of M tokens: activations of both GEMMs, routing, outputs."""

    def __init__(self, shape, M, dev, gen):
        E, topk, H, N = shape["E"], shape["topk"], shape["H"], shape["N"]
        block = shape["block"]
        self.M = M
        logits = torch.rand((M, E), generator=gen, device=dev)
        tw, ti = torch.topk(logits, topk, dim=1)
        self.topk_ids = ti.to(torch.int32).contiguous()
        self.topk_w = torch.softmax(tw, dim=1).float().contiguous()
        self.A1 = torch.randn((M, H), generator=gen, device=dev).to(wdtype(dev))
        self.A2 = torch.randn((M * topk, N), generator=gen, device=dev).to(wdtype(dev))
        if block is None:
            self.A1s = (torch.rand((1,), generator=gen, device=dev) * 0.02 + 0.01)
            self.A2s = (torch.rand((1,), generator=gen, device=dev) * 0.02 + 0.01)
        else:
            bk = block[1]
            self.A1s = torch.rand((M, -(-H // bk)), generator=gen, device=dev) * 0.02 + 0.01
            self.A2s = torch.rand((M * topk, -(-N // bk)), generator=gen, device=dev) * 0.02 + 0.01
        cdt = torch.bfloat16 if dev.type == "cuda" else torch.float32
        self.C1 = torch.empty((M, topk, 2 * N), device=dev, dtype=cdt)
        self.C2 = torch.empty((M, topk, H), device=dev, dtype=cdt)
        self.n_unique = int(torch.unique(self.topk_ids).numel())
        self._align = {}

    def assignment(self, BM, shape):
        if BM not in self._align:
            self._align[BM] = prepare_assignment(self.topk_ids, BM, shape["E"], self.M, shape["topk"])
        return self._align[BM]

    def gemm_args(self, gemm):
        if gemm == "w13":
            return self.A1, self.A1s, self.C1, False
        return self.A2, self.A2s, self.C2, True

    def floor_bytes(self, shape, gemm):
        Nout, K = gemm_dims(shape, gemm)
        M, topk = self.M, shape["topk"]
        w = self.n_unique * Nout * K
        if gemm == "w13":
            a = M * K
            c = M * topk * Nout * 2
        else:
            a = M * topk * K
            c = M * topk * Nout * 2
        return w + a + c


def launch(kmod, shape, gemm, inp: Inputs, W: Weights, wi: int, config, swap_ab=None):
    config = gemm_config(config, gemm)
    sorted_ids, expert_ids, ntpp = inp.assignment(config["BLOCK_SIZE_M"], shape)
    A, As, C, mul = inp.gemm_args(gemm)
    top_k = shape["topk"] if gemm == "w13" else 1
    invoke(kmod, A, W.B[wi], C, As, W.Bs[wi], inp.topk_w, sorted_ids, expert_ids, ntpp,
           mul, top_k, config, shape["block"], swap_ab=swap_ab)


def reference(shape, gemm, inp: Inputs, W: Weights, wi: int):
    block = shape["block"]
    A, As, C, mul = inp.gemm_args(gemm)
    top_k = shape["topk"] if gemm == "w13" else 1
    a = dequant_a(A, As, block)
    w = dequant_w(W.B[wi], W.Bs[wi], block)
    flat = inp.topk_ids.reshape(-1).long()
    out = torch.zeros((flat.numel(), w.shape[1]), device=A.device, dtype=torch.float32)
    for e in torch.unique(flat).tolist():
        idx = (flat == e).nonzero().squeeze(1)
        r = a[idx // top_k] @ w[e].t()
        if mul:
            r = r * inp.topk_w.reshape(-1)[idx].unsqueeze(1)
        out[idx] = r
    return out.view(C.shape)


# Hopper fp8 wgmma accumulates with reduced precision (the kernel passes acc=
# to tl.dot for fp8 fast accumulation), so the error vs an fp32 reference grows
# with K (measured ~2e-2 at K=6144 for every config alike); a wrong index or an
# unwritten element gives O(1) / NaN.
def check(kmod, shape, gemm, inp, W, config, ref, swap_ab=None, tol=5e-2):
    A, As, C, mul = inp.gemm_args(gemm)
    C.fill_(float("nan"))
    launch(kmod, shape, gemm, inp, W, 0, config, swap_ab=swap_ab)
    Cf = C.float()
    if torch.isnan(Cf).any():
        return False, float("nan")
    err = ((Cf - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return err < tol, err


# ----------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------
def measure_copy_bandwidth(dev, nbytes=2 << 30, reps=20):
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    src.random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    t = statistics.median(ts)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / t  # bytes read + written per second


def n_sets_for(touched_bytes_per_launch, total_weight_bytes, max_sets):
    """How many distinct (weights, inputs) sets a rotation needs so that the
    bytes one cycle touches exceed 3x L2."""
    need = math.ceil(3 * L2_BYTES / max(touched_bytes_per_launch, 1))
    return int(max(2, min(max_sets, need)))


def time_graph(fns, reps=20, warm=2):
    """Per-launch time (us): graph of all fns, median over replays / len(fns)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(s)
    # warm until >= 10 ms of replays: the first variant timed after a heavy
    # reference computation measured ~6% slow with a fixed 2-replay warm-up
    t_w = time.perf_counter()
    n_w = 0
    while n_w < warm or time.perf_counter() - t_w < 0.01:
        g.replay()
        torch.cuda.synchronize()
        n_w += 1
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in evs:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ts = [a.elapsed_time(b) * 1e3 / len(fns) for a, b in evs]
    return statistics.median(ts), g


def cupti_kernel_times(graphs_counts, replays=3, rounds=2):
    """min over `rounds` interleaved rounds of cupti_kernel_times_once."""
    best = None
    for _ in range(rounds):
        r = cupti_kernel_times_once(graphs_counts, replays)
        best = r if best is None else [min(a, b) if a == a and b == b else (a if a == a else b)
                                       for a, b in zip(best, r)]
    return best


def attach_cupti(records, enabled=True):
    """Take the CUDA graph out of each record that has one (run_config's "_graph")
    and, if enabled, store its CUPTI kernel time as "cupti_us" (one interleaved
    pass over all of them)."""
    timed = [r for r in records if "_graph" in r]
    graphs = [r.pop("_graph") for r in timed]
    if graphs and enabled:
        for r, k in zip(timed, cupti_kernel_times(graphs)):
            r["cupti_us"] = k


def cupti_kernel_times_once(graphs_counts, replays=3):
    """CUPTI (torch.profiler) kernel durations: for each (graph, launches per
    replay) returns the median fused_moe_kernel duration in us (NaN if absent)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except Exception:
        return [float("nan")] * len(graphs_counts)
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for g, _ in graphs_counts:
                for _ in range(replays):
                    g.replay()
                torch.cuda.synchronize()
        evs = [e for e in prof.events() if "fused_moe_kernel" in e.name and e.device_type.name == "CUDA"]
        evs.sort(key=lambda e: e.time_range.start)
        want = sum(c * replays for _, c in graphs_counts)
        if len(evs) != want:
            return [float("nan")] * len(graphs_counts)
        out, i = [], 0
        for _, c in graphs_counts:
            chunk = evs[i: i + c * replays]
            i += c * replays
            out.append(statistics.median([e.time_range.end - e.time_range.start for e in chunk]))
        return out
    except Exception as ex:  # noqa: BLE001
        print(f"[cupti] unavailable: {ex!r}", flush=True)
        return [float("nan")] * len(graphs_counts)


# ----------------------------------------------------------------------------
# per-shape context: weights + input sets, sized for L2 rotation
# ----------------------------------------------------------------------------
class ShapeCtx:
    def __init__(self, name, dev, max_sets=16, seed=1234):
        self.name = name
        self.shape = SHAPES[name]
        self.dev = dev
        sh = self.shape
        per_exp = {g: gemm_dims(sh, g)[0] * gemm_dims(sh, g)[1] for g in ("w13", "w2")}
        # worst case (M=1): topk experts touched per launch
        touched1 = min(sh["topk"], sh["E"]) * per_exp["w13"]
        self.max_sets = n_sets_for(touched1, sh["E"] * per_exp["w13"], max_sets)
        self.W = {g: Weights(sh, g, self.max_sets, dev, seed=seed + i) for i, g in enumerate(("w13", "w2"))}
        self.inputs = {}
        self.refs = {}
        self.gen = torch.Generator(device=dev).manual_seed(seed)

    def sets_for(self, M, gemm):
        inp = self.get_inputs(M, 0)
        Nout, K = gemm_dims(self.shape, gemm)
        touched = inp.n_unique * Nout * K
        return n_sets_for(touched, self.shape["E"] * Nout * K, self.max_sets)

    def get_inputs(self, M, i):
        key = (M, i)
        if key not in self.inputs:
            self.inputs[key] = Inputs(self.shape, M, self.dev, self.gen)
        return self.inputs[key]

    def ref(self, M, gemm):
        key = (M, gemm)
        if key not in self.refs:
            self.refs[key] = reference(self.shape, gemm, self.get_inputs(M, 0), self.W[gemm], 0)
        return self.refs[key]

    def drop_m(self, M):
        for k in [k for k in self.inputs if k[0] == M]:
            del self.inputs[k]
        for k in [k for k in self.refs if k[0] == M]:
            del self.refs[k]

    def floor_s(self, M, gemm, bw):
        return self.get_inputs(M, 0).floor_bytes(self.shape, gemm) / bw

    def fns(self, kmod, M, gemm, config, swap_ab=None):
        n = self.sets_for(M, gemm)
        out = []
        for i in range(n):
            inp = self.get_inputs(M, i)
            out.append(lambda inp=inp, i=i: launch(kmod, self.shape, gemm, inp, self.W[gemm], i, config, swap_ab))
        return out


def run_config(ctx: ShapeCtx, kmod, M, gemm, config, swap_ab=None, reps=20, want_graph=False):
    """check + time one (config, gemm, M). Returns dict."""
    gc = gemm_config(config, gemm)
    res = {"cfg": cfg_str(gc), "swap": swap_of(gc, swap_ab)}
    try:
        ok, err = check(kmod, ctx.shape, gemm, ctx.get_inputs(M, 0), ctx.W[gemm], config, ctx.ref(M, gemm), swap_ab)
    except Exception as ex:  # noqa: BLE001  (OutOfResources etc.)
        res.update(ok=False, err=repr(ex)[:200], us=float("inf"))
        return res
    res["relerr"] = err
    if not ok:
        res.update(ok=False, us=float("inf"))
        return res
    fns = ctx.fns(kmod, M, gemm, config, swap_ab)
    us, g = time_graph(fns, reps=reps)
    res.update(ok=True, us=us, nsets=len(fns))
    if gc.get("SPLIT_K", 1) > 1:
        # split-K must leave its workspace zeroed: check again after the replays
        ok2, err2 = check(kmod, ctx.shape, gemm, ctx.get_inputs(M, 0), ctx.W[gemm], config, ctx.ref(M, gemm), swap_ab)
        if not ok2:
            res.update(ok=False, us=float("inf"), err=f"after timing: relerr={err2}")
    if want_graph:
        res["_graph"] = (g, len(fns))
    else:
        del g
    return res


# ----------------------------------------------------------------------------
# search space
# ----------------------------------------------------------------------------
SPACE = "default"


def wide_decode_configs(shape) -> list[dict]:
    """Extra decode (BM=16) candidates: narrow N tiles for more CTAs, deep K."""
    block = shape["block"]
    out = []
    for bn, bk, w, s in itertools.product([16, 32, 64, 128], [64, 128] if block else [128, 256, 512],
                                          [2, 4], [3, 4, 5, 6]):
        if (16 * bk + bk * bn) * s > 200 * 1024:
            continue
        out.append({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
                    "num_warps": w, "num_stages": s})
    return out


def candidate_configs(shape, M) -> list[dict]:
    if SPACE == "wide" and M * shape["topk"] / shape["E"] <= 1:
        seen, out = set(), []
        for c in _candidate_configs(shape, M) + wide_decode_configs(shape):
            if cfg_str(c) not in seen:
                seen.add(cfg_str(c))
                out.append(c)
        return out
    return _candidate_configs(shape, M)


def _candidate_configs(shape, M) -> list[dict]:
    E, topk = shape["E"], shape["topk"]
    tpe = M * topk / E  # routed tokens per expert
    block = shape["block"]
    if tpe <= 4:
        bms = [16, 32] if tpe > 1 else [16]
    elif tpe <= 16:
        bms = [16, 32, 64]
    elif tpe <= 64:
        bms = [32, 64, 128]
    else:
        bms = [64, 128]
    bks = [128] if block else [128, 256]
    out = []
    for bm in bms:
        bns = [32, 64, 128, 256] if bm <= 32 else [64, 128, 256]
        groups = [1] if tpe <= 16 else [1, 16]
        warps = [4] if bm <= 32 else [4, 8]
        stages = [3, 4, 5] if bm <= 32 else [3, 4]
        for bn, bk, gm, w, s in itertools.product(bns, bks, groups, warps, stages):
            if bm <= 32 and bn == 256 and bk == 256:
                continue
            if bm == 128 and bn == 256 and s > 3:
                continue
            smem = (bm * bk + bk * bn) * s
            if smem > 200 * 1024:
                continue
            out.append({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": gm,
                        "num_warps": w, "num_stages": s})
    if tpe <= 4:
        # small-M: warps 8 only for the widest tiles
        for c in list(out):
            if c["BLOCK_SIZE_N"] >= 128 and c["num_stages"] == 4:
                out.append(dict(c, num_warps=8))
    return out


# ----------------------------------------------------------------------------
# parallel precompile: worker processes launch each config once on tiny data;
# the main process then loads the cubins from the shared Triton cache dir.
# ----------------------------------------------------------------------------
_W = {}


def _worker_init(srcs):
    torch.cuda.set_device(0)
    _W["kmods"] = {tag: load_kernel(path, tag)[0] for tag, path in srcs.items()}
    _W["ctx"] = {}


def _fake_problem(sh, M, gemm, BM, dev):
    """Empty tensors with the sizes/dtypes the real launch has: enough for
    Triton to compile the same specialization, launching no GPU work."""
    E, topk, H, N = sh["E"], sh["topk"], sh["H"], sh["N"]
    numel = M * topk
    if M * topk * 4 <= E:
        sorted_ids = None
        expert_ids = torch.empty((numel,), dtype=torch.int32, device=dev)
    else:
        mp_ = numel + E * (BM - 1)
        if numel < E:
            mp_ = min(numel * BM, mp_)
        sorted_ids = torch.empty((mp_,), dtype=torch.int32, device=dev)
        expert_ids = torch.empty((-(-mp_ // BM),), dtype=torch.int32, device=dev)
    ntpp = torch.empty((1,), dtype=torch.int32, device=dev)
    topk_w = torch.empty((M, topk), dtype=torch.float32, device=dev)
    Nout, K = gemm_dims(sh, gemm)
    rows = M if gemm == "w13" else M * topk
    A = torch.empty((rows, K), dtype=wdtype(dev), device=dev)
    if sh["block"] is None:
        As = torch.empty((1,), dtype=torch.float32, device=dev)
    else:
        As = torch.empty((rows, -(-K // sh["block"][1])), dtype=torch.float32, device=dev)
    C = torch.empty((M, topk, Nout), dtype=torch.bfloat16, device=dev)
    return A, As, C, topk_w, sorted_ids, expert_ids, ntpp


def _worker_compile(src_tag, shape_name, config, Ms, swaps=(None,), gemms=GEMM_NAMES):
    """Compile (Triton warmup, no launch) one config for the given token counts."""
    import traceback

    dev = torch.device("cuda")
    sh = SHAPES[shape_name]
    if shape_name not in _W["ctx"]:
        _W["ctx"] = {}  # one shape's weights at a time
        W = {}
        for g in ("w13", "w2"):
            Nout, K = gemm_dims(sh, g)
            B = torch.empty((sh["E"], Nout, K), dtype=wdtype(dev), device=dev)
            if sh["block"] is None:
                Bs = torch.empty((sh["E"],), dtype=torch.float32, device=dev)
            else:
                bn, bk = sh["block"]
                Bs = torch.empty((sh["E"], -(-Nout // bn), -(-K // bk)), dtype=torch.float32, device=dev)
            W[g] = (B, Bs)
        _W["ctx"][shape_name] = W
    W = _W["ctx"][shape_name]
    t0 = time.time()
    try:
        for M in Ms:
            for g in gemms:
                A, As, C, tw, sid, eid, ntpp = _fake_problem(sh, M, g, config["BLOCK_SIZE_M"], dev)
                top_k = sh["topk"] if g == "w13" else 1
                for sw in swaps:
                    invoke(_W["kmods"][src_tag], A, W[g][0], C, As, W[g][1], tw, sid, eid, ntpp,
                           g == "w2", top_k, gemm_config(config, g), sh["block"], swap_ab=sw, warmup=True)
        return True, time.time() - t0
    except Exception:  # noqa: BLE001
        return False, traceback.format_exc()[-300:]


class Precompiler:
    """Process pool that compiles into the shared TRITON_CACHE_DIR."""

    def __init__(self, workers, srcs):
        import concurrent.futures as cf
        import multiprocessing as mp

        self.futs = {}
        self.pool = None
        if workers > 0:
            self.pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                               initializer=_worker_init, initargs=(srcs,))

    def submit(self, key, *job):
        if self.pool is None or key in self.futs:
            return
        self.futs[key] = self.pool.submit(_worker_compile, *job)

    def wait(self, key, t_end):
        f = self.futs.get(key)
        if f is None:
            return True, None
        try:
            return f.result(timeout=max(1.0, t_end - time.time()))
        except Exception as ex:  # noqa: BLE001
            return False, repr(ex)

    def close(self):
        if self.pool is not None:
            for f in self.futs.values():
                f.cancel()
            self.pool.shutdown(wait=False, cancel_futures=True)


def compile_variant_ms(shape, Ms):
    """Representative Ms hitting each code variant (naive / aligned, M<BM)."""
    E, topk = shape["E"], shape["topk"]
    reps = {}
    for M in Ms:
        naive = M * topk * 4 <= E
        reps.setdefault(naive, M)
    return sorted(reps.values())


# ----------------------------------------------------------------------------
# modes
# ----------------------------------------------------------------------------
def dump(out_dir, name, obj):
    p = Path(out_dir) / name
    p.write_text(json.dumps(obj, indent=1, default=str))


def bench_variants(args, sh, M):
    """(name, config entry, forced swap, where from, kernel source): stock =
    stock vLLM (stock source, its file or default); ours = the image (patched
    source, --configs-dir); prev = --prev-configs-dir with the patched source."""
    variants = []
    cs, src_s = try_get_config(sh, M, [args.stock_configs_dir])
    variants.append(("stock", cfg_clean(cs), None, src_s, "stock"))
    if args.noswap and enable_swap_ab(cs["BLOCK_SIZE_M"], cs["BLOCK_SIZE_N"]):
        variants.append(("stock_noswap", cfg_clean(cs), False, src_s, "stock"))
    for vname, folder in (("ours", args.configs_dir), ("prev", args.prev_configs_dir)):
        if folder:
            co, src_o = try_get_config(sh, M, [folder])
            if src_o != "default":
                variants.append((vname, co, None, src_o, "patched"))
                if args.noswap and vname == "ours" and enable_swap_ab(co["BLOCK_SIZE_M"], co["BLOCK_SIZE_N"]):
                    variants.append(("ours_noswap", co, False, src_o, "patched"))
    return variants


def mode_bench(args, kstock, kpatched, dev, bw, out, pc: "Precompiler"):
    """stock vLLM vs ours (and prev); optionally swap-AB forced off; floor fraction."""
    kmods = {"stock": kstock, "patched": kpatched or kstock}
    rows = []
    for name in args.shapes:
        sh = SHAPES[name]
        for M in args.ms:
            for vname, cfg, swap, src, tag in bench_variants(args, sh, M):
                pc.submit(("bench", tag, name, entry_str(cfg), M, swap), tag, name, cfg, [M], (swap,))
    for name in args.shapes:
        if time.time() > args.t_end:
            print(f"[bench] deadline: skip {name}", flush=True)
            continue
        ctx = ShapeCtx(name, dev)
        sh = ctx.shape
        for M in args.ms:
            if time.time() > args.t_end:
                break
            variants = bench_variants(args, sh, M)
            for vname, cfg, swap, src, tag in variants:
                pc.wait(("bench", tag, name, entry_str(cfg), M, swap), args.t_end)
            for g in ("w13", "w2"):
                floor_us = ctx.floor_s(M, g, bw) * 1e6
                recs = []
                for vname, cfg, swap, src, tag in variants:
                    r = run_config(ctx, kmods[tag], M, g, cfg, swap_ab=swap, reps=args.reps, want_graph=True)
                    r.update(shape=name, M=M, gemm=g, variant=vname, src=src, floor_us=floor_us,
                             entry=entry_str(cfg), kernel_source=tag)
                    recs.append(r)
                attach_cupti(recs, enabled=not args.no_cupti)
                rows += recs
                for r in recs:
                    t = r.get("cupti_us", float("nan"))
                    if not (t == t):
                        t = r["us"]
                    r["frac_floor"] = floor_us / t if t and t != float("inf") else 0.0
                    print(f"[bench] {name:22s} M={M:5d} {g:3s} {r['variant']:12s} {r['cfg']:22s} swap={int(r['swap'])}"
                          f" graph={r['us']:8.2f}us cupti={r.get('cupti_us', float('nan')):8.2f}us floor={floor_us:7.2f}us"
                          f" frac={r['frac_floor']:.2f} ok={r['ok']} src={r['src']}", flush=True)
            ctx.drop_m(M)
        del ctx
        torch.cuda.empty_cache()
        dump(out, f"bench_{args.tag}.json", {"bw": bw, "rows": rows})
    dump(out, f"bench_{args.tag}.json", {"bw": bw, "rows": rows})
    return rows


def plan_steps(args, plan, dev, tag):
    """(shape name, its ShapeCtx, M) for each step of a tune plan, one context
    per shape, until args.t_end; each M's inputs are dropped after its step."""
    for name, ms in plan:
        if time.time() > args.t_end:
            print(f"[{tag}] deadline: skip {name} {ms}", flush=True)
            continue
        ctx = ShapeCtx(name, dev)
        for M in ms:
            if time.time() > args.t_end:
                print(f"[{tag}] deadline: stop {name} at M={M}", flush=True)
                break
            yield name, ctx, M
            ctx.drop_m(M)
        del ctx
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def gemm_variants(shape, M, gemm, c) -> list[dict]:
    """Patch 0003/0004 variants of one base config for one GEMM: SPLIT_K
    (decode: too few programs for the H200's memory) and swap-AB forced off
    (w2 at M=2-4 measured faster unswapped)."""
    E, topk = shape["E"], shape["topk"]
    tpe = M * topk / E
    Nout, K = gemm_dims(shape, gemm)
    out = []
    if tpe <= 2:
        kt = -(-K // (min(c["BLOCK_SIZE_K"], shape["block"][1]) if shape["block"] else c["BLOCK_SIZE_K"]))
        for sk in (2, 4, 8):
            if kt >= 2 * sk:
                out.append(dict(c, SPLIT_K=sk))
    if tpe <= 4 and enable_swap_ab(c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"]):
        out.append(dict(c, SWAP_AB=False))
    return out


def mode_gemm_tune(args, kmod, kstock, dev, bw, out, pc: "Precompiler"):
    """Per-GEMM tuning with the patched kernel source (patches 0003/0004): for
    each (shape, M) and GEMM, time the base candidates, then the split-K /
    swap-off variants of the best few; pick the (w13, w2) pair with one BLOCK_SIZE_M
    (both GEMMs share the alignment) of least summed time; re-measure the
    best pairs and the stock choice (stock kernel source) with CUPTI."""
    results = {}
    plan = list(args.tune_plan)
    for name, ms in plan:
        sh = SHAPES[name]
        for M in ms:
            for g in GEMM_NAMES:
                for c in candidate_configs(sh, M):
                    pc.submit(("gt", name, g, cfg_str(c)), "patched", name, c, compile_variant_ms(sh, [M]),
                              (None,), (g,))
    for name, ctx, M in plan_steps(args, plan, dev, "gtune"):
        sh = ctx.shape
        results.setdefault(name, {})
        t0 = time.time()
        per = {g: [] for g in GEMM_NAMES}

        def try_cfgs(g, cfgs):
            for c in cfgs:
                key = ("gt", name, g, cfg_str(c))
                okc, info = pc.wait(key, args.t_end + 30)
                if not okc:
                    per[g].append({"cfg": cfg_str(c), "ok": False, "err": str(info)[-200:]})
                    continue
                r = run_config(ctx, kmod, M, g, c, reps=args.reps)
                r["config"] = c
                per[g].append(r)

        for g in GEMM_NAMES:
            try_cfgs(g, candidate_configs(sh, M))
            okb = sorted((r for r in per[g] if r.get("ok")), key=lambda r: r["us"])
            # split-K / swap-off variants of the best few base configs and of the best per BLOCK_SIZE_M
            seeds, seen_bm = okb[: args.seeds], set()
            for r in okb:
                if r["config"]["BLOCK_SIZE_M"] not in seen_bm:
                    seen_bm.add(r["config"]["BLOCK_SIZE_M"])
                    if r not in seeds:
                        seeds.append(r)
            var = {}
            for r in seeds:
                for v in gemm_variants(sh, M, g, r["config"]):
                    var.setdefault(cfg_str(v), v)
            for v in var.values():
                pc.submit(("gt", name, g, cfg_str(v)), "patched", name, v, compile_variant_ms(sh, [M]),
                          (None,), (g,))
            try_cfgs(g, list(var.values()))
        ok = {g: [r for r in per[g] if r.get("ok")] for g in GEMM_NAMES}
        cs, src = try_get_config(sh, M, [args.stock_configs_dir])
        cs = cfg_clean(cs)
        # pairs: best per GEMM for each shared BLOCK_SIZE_M
        pairs = []
        for bm in sorted({r["config"]["BLOCK_SIZE_M"] for r in ok["w13"]} &
                         {r["config"]["BLOCK_SIZE_M"] for r in ok["w2"]}):
            b13 = sorted((r for r in ok["w13"] if r["config"]["BLOCK_SIZE_M"] == bm), key=lambda r: r["us"])
            b2 = sorted((r for r in ok["w2"] if r["config"]["BLOCK_SIZE_M"] == bm), key=lambda r: r["us"])
            pairs.append((b13[0]["us"] + b2[0]["us"], bm, b13[: args.topk_cupti], b2[: args.topk_cupti]))
        pairs.sort(key=lambda p: p[0])
        rec = {"stock": {"cfg": cfg_str(cs), "src": src}, "floor_w13_us": ctx.floor_s(M, "w13", bw) * 1e6,
               "floor_w2_us": ctx.floor_s(M, "w2", bw) * 1e6,
               "n_tried": {g: len(per[g]) for g in GEMM_NAMES}, "n_ok": {g: len(ok[g]) for g in GEMM_NAMES}}
        if pairs and not args.no_cupti:
            # CUPTI: top configs of the 2 best BLOCK_SIZE_M, plus stock (stock kernel source)
            for g in GEMM_NAMES:
                cands = []
                for p in pairs[:2]:
                    cands += p[2] if g == "w13" else p[3]
                graphs = []
                for r in cands:
                    rr = run_config(ctx, kmod, M, g, r["config"], reps=3, want_graph=True)
                    graphs.append(rr.pop("_graph"))
                rs = run_config(ctx, kstock, M, g, cs, reps=3, want_graph=True)
                graphs.append(rs.pop("_graph"))
                ks = cupti_kernel_times(graphs)
                for r, k in zip(cands, ks):
                    r["cupti_us"] = k
                rec["stock"][f"{g}_cupti_us"] = ks[-1]
                rec["stock"][f"{g}_us"] = rs["us"]
                del graphs
            best = None
            for p in pairs[:2]:
                b13 = min(p[2], key=lambda r: r.get("cupti_us", float("inf")))
                b2 = min(p[3], key=lambda r: r.get("cupti_us", float("inf")))
                tot = b13.get("cupti_us", float("inf")) + b2.get("cupti_us", float("inf"))
                if best is None or tot < best[0]:
                    best = (tot, b13, b2)
            tot, b13, b2 = best
            entry = make_entry(b13["config"], b2["config"])
            rec["best"] = {"entry": entry, "str": entry_str(entry), "w13_cupti_us": b13["cupti_us"],
                           "w2_cupti_us": b2["cupti_us"], "total_cupti_us": tot,
                           "w13_us": b13["us"], "w2_us": b2["us"]}
            st = rec["stock"]
            rec["ratio"] = tot / (st["w13_cupti_us"] + st["w2_cupti_us"])
        # what each kind of variant achieves alone (graph timer), for the record
        fam = {}
        for g in GEMM_NAMES:
            for r in ok[g]:
                c = r["config"]
                kind = "split" if c.get("SPLIT_K", 1) > 1 else "noswap" if "SWAP_AB" in c else "base"
                k2 = f"{g}_{kind}"
                if k2 not in fam or r["us"] < fam[k2]["us"]:
                    fam[k2] = {"cfg": r["cfg"], "us": r["us"]}
        rec["best_by_kind"] = fam
        if args.keep_all:
            rec["all"] = {g: [{k: v for k, v in r.items() if k != "config"} for r in per[g]] for g in GEMM_NAMES}
        results[name][M] = rec
        b = rec.get("best", {})
        st = rec["stock"]
        print(f"[gtune] {name:22s} M={M:5d} best {b.get('str')} "
              f"{b.get('w13_cupti_us', float('nan')):.2f}+{b.get('w2_cupti_us', float('nan')):.2f}"
              f"={b.get('total_cupti_us', float('nan')):.2f}us stock {st['cfg']}({src}) "
              f"{st.get('w13_cupti_us', float('nan')):.2f}+{st.get('w2_cupti_us', float('nan')):.2f} "
              f"ratio={rec.get('ratio', float('nan')):.3f} floor={rec['floor_w13_us']:.2f}+{rec['floor_w2_us']:.2f} "
              f"frac={rec['floor_w13_us'] / b.get('w13_cupti_us', float('inf')):.2f}/"
              f"{rec['floor_w2_us'] / b.get('w2_cupti_us', float('inf')):.2f} "
              f"tried={rec['n_tried']} t={time.time() - t0:.1f}s", flush=True)
        print(f"[gtune] {name:22s} M={M:5d} by kind: " + " ".join(
            f"{k}={v['cfg']}:{v['us']:.2f}" for k, v in sorted(fam.items())), flush=True)
        dump(out, f"gtune_{args.tag}.json", {"bw": bw, "results": results})
    dump(out, f"gtune_{args.tag}.json", {"bw": bw, "results": results})
    return results


def mode_tune(args, kmod, dev, bw, out, pc: "Precompiler"):
    results = {}
    plan = list(args.tune_plan)
    # submit all compiles up front, in priority order
    n = 0
    for name, ms in plan:
        sh = SHAPES[name]
        per_cfg = {}
        for M in ms:
            cs, _ = try_get_config(sh, M, [args.stock_configs_dir])
            for c in candidate_configs(sh, M) + [cfg_clean(cs)]:
                per_cfg.setdefault(cfg_str(c), (c, []))[1].append(M)
        for key, (c, cms) in per_cfg.items():
            pc.submit(("tune", name, key), args.tune_tag, name, c, compile_variant_ms(sh, cms))
            n += 1
    print(f"[tune] submitted {n} compile jobs", flush=True)
    for name, ctx, M in plan_steps(args, plan, dev, "tune"):
        sh = ctx.shape
        results.setdefault(name, {})
        t0 = time.time()
        best = None
        per = []
        for c in candidate_configs(sh, M):
            key = cfg_str(c)
            okc, info = pc.wait(("tune", name, key), args.t_end)
            if not okc:
                per.append({"cfg": key, "ok": False, "err": str(info)[-200:]})
                continue
            if time.time() > args.t_end + 30:
                break
            r13 = run_config(ctx, kmod, M, "w13", c, reps=args.reps)
            if not r13["ok"]:
                per.append({"cfg": key, "ok": False, "err": r13.get("err", f"relerr={r13.get('relerr')}")})
                continue
            r2 = run_config(ctx, kmod, M, "w2", c, reps=args.reps)
            if not r2["ok"]:
                per.append({"cfg": key, "ok": False, "err": r2.get("err", f"relerr={r2.get('relerr')}")})
                continue
            tot = r13["us"] + r2["us"]
            per.append({"cfg": key, "config": c, "ok": True, "w13_us": r13["us"], "w2_us": r2["us"],
                        "total_us": tot, "relerr13": r13["relerr"], "relerr2": r2["relerr"]})
            if best is None or tot < best["total_us"]:
                best = per[-1]
        # stock / default reference at this M (same timer)
        cs, src = try_get_config(sh, M, [args.stock_configs_dir])
        s13 = run_config(ctx, kmod, M, "w13", cs, reps=args.reps)
        s2 = run_config(ctx, kmod, M, "w2", cs, reps=args.reps)
        okp = [p for p in per if p.get("ok")]
        # re-measure the 3 fastest (graph timer) and the stock choice with CUPTI, interleaved
        top = sorted(okp, key=lambda p: p["total_us"])[: args.topk_cupti]
        if top and s13["ok"] and s2["ok"] and not args.no_cupti:
            cfgs = [p["config"] for p in top] + [cs]
            tot = [0.0] * len(cfgs)
            for g in ("w13", "w2"):
                graphs = []
                for c in cfgs:
                    r = run_config(ctx, kmod, M, g, c, reps=3, want_graph=True)
                    graphs.append(r.pop("_graph"))
                ks = cupti_kernel_times(graphs)
                for i, k in enumerate(ks):
                    tot[i] += k
                    key = f"{g}_cupti_us"
                    if i < len(top):
                        top[i][key] = k
                del graphs
                stock_cupti = ks[-1]
                if g == "w13":
                    s13["cupti_us"] = stock_cupti
                else:
                    s2["cupti_us"] = stock_cupti
            if all(t == t for t in tot):
                for i, p in enumerate(top):
                    p["total_cupti_us"] = tot[i]
                best = min(top, key=lambda p: p["total_cupti_us"])
        best13 = min(okp, key=lambda p: p["w13_us"]) if okp else None
        best2 = min(okp, key=lambda p: p["w2_us"]) if okp else None
        f13 = ctx.floor_s(M, "w13", bw) * 1e6
        f2 = ctx.floor_s(M, "w2", bw) * 1e6
        results[name][M] = {
            "best": best, "stock": {"cfg": cfg_str(cs), "src": src, "w13_us": s13["us"], "w2_us": s2["us"],
                                    "total_us": s13["us"] + s2["us"],
                                    "total_cupti_us": s13.get("cupti_us", float("nan")) + s2.get("cupti_us", float("nan"))},
            "top_cupti": [{k: p.get(k) for k in ("cfg", "total_us", "total_cupti_us")} for p in top],
            "best_w13_only": best13 and {"cfg": best13["cfg"], "us": best13["w13_us"]},
            "best_w2_only": best2 and {"cfg": best2["cfg"], "us": best2["w2_us"]},
            "floor_w13_us": f13, "floor_w2_us": f2, "n_tried": len(per), "n_ok": len(okp),
            "all": per if args.keep_all else None,
        }
        b = best or {}
        print(f"[tune] {name:22s} M={M:5d} CUPTI w13+w2: best {b.get('total_cupti_us', float('nan')):.2f}us "
              f"stock {results[name][M]['stock']['total_cupti_us']:.2f}us", flush=True)
        print(f"[tune] {name:22s} M={M:5d} tried={len(per):3d} ok={len(okp):3d} "
              f"best={b.get('cfg')} {b.get('w13_us', 0):.2f}+{b.get('w2_us', 0):.2f}={b.get('total_us', 0):.2f}us "
              f"stock={cfg_str(cs)}({src}) {s13['us']:.2f}+{s2['us']:.2f}={s13['us'] + s2['us']:.2f}us "
              f"floor={f13:.2f}+{f2:.2f} t={time.time() - t0:.1f}s", flush=True)
        dump(out, f"tune_{args.tag}.json", {"bw": bw, "results": results})
    dump(out, f"tune_{args.tag}.json", {"bw": bw, "results": results})
    return results


class CompileCounter:
    def __init__(self):
        self.events = []
        import triton

        self.knobs = triton.knobs
        self.prev = triton.knobs.runtime.jit_post_compile_hook
        triton.knobs.runtime.jit_post_compile_hook = self

    def __call__(self, *, key=None, repr=None, fn=None, compile=None, is_manual_warmup=False, already_compiled=False):
        self.events.append((fn.name if fn is not None else "?", repr))
        return False

    def close(self):
        self.knobs.runtime.jit_post_compile_hook = self.prev


def vllm_warmup_ms(max_tokens=8192, max_capture=512):
    # vLLM V1 cudagraph capture sizes [1, 2, 4] + range(8, 256, 8) + range(256, max+1, 16)
    # plus the profile / dummy run at max_num_batched_tokens
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_capture + 1, 16))
    return sizes + [max_tokens]


def jit_sweep(kmod, shape_name, dev, folders, ms_warm, ms_traffic, label):
    """Call w13+w2 as the serving path would; count compiles and their time."""
    import triton

    sh = SHAPES[shape_name]
    cache_dir = tempfile.mkdtemp(prefix=f"triton_cache_{label}_")
    saved_env = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    try:
        triton.knobs.cache.dir = cache_dir
    except Exception:  # noqa: BLE001
        pass
    W = {g: Weights(sh, g, 1, dev) for g in ("w13", "w2")}
    gen = torch.Generator(device=dev).manual_seed(7)
    for kname in ("fused_moe_kernel", "fused_moe_kernel_split_k"):  # forget compiles of earlier sweeps
        if hasattr(kmod, kname):
            getattr(kmod, kname).device_caches.clear()
    cc = CompileCounter()
    phases = {}
    try:
        for phase, ms in (("warmup", ms_warm), ("traffic", ms_traffic)):
            n0 = len(cc.events)
            ctime = 0.0
            new_at = []
            t_phase = time.time()
            for M in ms:
                cfg, _ = try_get_config(sh, M, folders)
                inp = Inputs(sh, M, dev, gen)
                inp.assignment(cfg["BLOCK_SIZE_M"], sh)
                torch.cuda.synchronize()
                k0 = len(cc.events)
                t0 = time.perf_counter()
                for g in ("w13", "w2"):
                    launch(kmod, sh, g, inp, W[g], 0, cfg)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if len(cc.events) > k0:
                    ctime += dt
                    new_at.append((M, len(cc.events) - k0, entry_str(cfg)))
            phases[phase] = {"compiles": len(cc.events) - n0, "compile_s": ctime, "wall_s": time.time() - t_phase,
                             "new_at": new_at}
    finally:
        cc.close()
        if saved_env is not None:
            os.environ["TRITON_CACHE_DIR"] = saved_env
            try:
                triton.knobs.cache.dir = saved_env
            except Exception:  # noqa: BLE001
                pass
    # distinct (GEMM, config) pairs the per-M dispatch can pick: with patch 0002
    # each should compile once (the kernel also differs per GEMM: N, K, top_k)
    n_cfg = len({(g, cfg_str(gemm_config(try_get_config(sh, M, folders)[0], g)))
                 for M in list(ms_warm) + list(ms_traffic) for g in GEMM_NAMES})
    return {"label": label, "shape": shape_name, "distinct_gemm_configs": n_cfg, **phases}


def extended_warmup_ms(shape, folders, max_tokens=8192):
    """vLLM's warm-up sizes plus one M per config-file key (so every config the
    per-M dispatch can pick is compiled) plus both sides of the naive-block-
    assignment boundary (M*top_k*4 <= E): naive_block_assignment is a
    constexpr, so a config used on both sides compiles twice. Patch 0005 makes
    vLLM's warm-up reach the same (config, path) pairs."""
    sh = shape
    ms = vllm_warmup_ms(max_tokens)
    cfgs, _ = get_moe_configs(sh["E"], sh["N"], sh["block"], folders)
    keys = sorted(cfgs) if cfgs else []
    b = sh["E"] // (4 * sh["topk"])
    extra = keys + ([b, b + 1] if b >= 1 else [])
    return ms + [m for m in extra if m not in ms]


def mode_jit(args, kstock, kpatched, dev, bw, out):
    res = {"stock_src": args.fused_moe_py, "patched_src": args.patched_fused_moe_py,
           "stock_decorator": kernel_decorator_text(args.fused_moe_py),
           "patched_decorator": kernel_decorator_text(args.patched_fused_moe_py)}
    name = args.jit_shape
    # stock = stock vLLM (its configs); patched = the image (ours first, with --jit-use-ours)
    stock_folders = [args.stock_configs_dir]
    folders = [args.configs_dir, args.stock_configs_dir] if args.jit_use_ours else stock_folders
    # (a) one fixed config over M=1..64 (issue's reference: stock 3 / patched 1 compiles per GEMM... per config)
    sh = SHAPES[name]
    fixed = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 4}
    fixed_dir = tempfile.mkdtemp(prefix="fixedcfg_")
    with open(os.path.join(fixed_dir, config_file_name(sh["E"], sh["N"], sh["block"])), "w") as f:
        json.dump({"1": fixed}, f)
    parts = args.jit_parts.split(",")
    for label, km in (("stock", kstock), ("patched", kpatched)):
        if "fixed" not in parts:
            break
        r = jit_sweep(km, name, dev, [fixed_dir], [], list(range(1, 65)), f"{label}_fixedcfg")
        res[f"{label}_fixed_1_64"] = r
        print(f"[jit] fixed config {cfg_str(fixed)} M=1..64 {label}: {r['traffic']['compiles']} compiles "
              f"(w13+w2) {r['traffic']['compile_s']:.1f}s", flush=True)
    # (b) vLLM per-M dispatch, warm-up then traffic 1..8192
    ms_warm = vllm_warmup_ms()
    ms_traffic = list(range(1, args.jit_max_m + 1))
    runs = []
    if "dispatch" in parts:
        runs += [("stock", kstock, ms_warm, stock_folders), ("patched", kpatched, ms_warm, folders)]
    if "dispatch_ext" in parts:
        ext_s, ext_p = extended_warmup_ms(sh, stock_folders), extended_warmup_ms(sh, folders)
        res["extended_warmup_extra_ms"] = {"stock": [m for m in ext_s if m not in ms_warm],
                                           "patched": [m for m in ext_p if m not in ms_warm]}
        runs += [("stock_extwarm", kstock, ext_s, stock_folders), ("patched_extwarm", kpatched, ext_p, folders)]
    for label, km, warm_ms, fl in runs:
        if time.time() > args.t_end:
            break
        r = jit_sweep(km, name, dev, fl, warm_ms, ms_traffic, label)
        res[label] = r
        print(f"[jit] {label:8s} {name} distinct (GEMM, config) pairs={r['distinct_gemm_configs']} "
              f"warmup: {r['warmup']['compiles']} compiles {r['warmup']['compile_s']:.1f}s; "
              f"traffic 1..{args.jit_max_m}: {r['traffic']['compiles']} compiles {r['traffic']['compile_s']:.1f}s "
              f"first new at {r['traffic']['new_at'][:6]}", flush=True)
        dump(out, f"jit_{args.tag}.json", res)
    # (c) steady state: stock, patched, stock again (noise), the same (stock vLLM's) per-M config
    ss = []
    ctx = ShapeCtx(name, dev) if "steady" in parts else None
    for M in (args.jit_ss_ms if "steady" in parts else []):
        if time.time() > args.t_end:
            break
        cfg, src = try_get_config(sh, M, stock_folders)
        row = {"M": M, "cfg": cfg_str(cfg)}
        labels = (("stock_a", kstock), ("patched", kpatched), ("stock_b", kstock))
        for label, _ in labels:
            row[label] = 0.0
            row[label + "_graph"] = 0.0
        for g in ("w13", "w2"):
            graphs = []
            for label, km in labels:
                r = run_config(ctx, km, M, g, cfg, reps=args.reps, want_graph=True)
                row[label + "_graph"] += r["us"] if r["ok"] else float("inf")
                graphs.append(r.pop("_graph") if r["ok"] else None)
            if all(x is not None for x in graphs) and not args.no_cupti:
                ks = cupti_kernel_times(graphs)
            else:
                ks = [float("nan")] * 3
            for (label, _), k in zip(labels, ks):
                row[label] += k
            del graphs
        if not all(row[label] == row[label] for label, _ in labels):  # no CUPTI: graph timer
            for label, _ in labels:
                row[label] = row[label + "_graph"]
        row["noise"] = abs(row["stock_a"] - row["stock_b"]) / min(row["stock_a"], row["stock_b"])
        row["patched_vs_stock"] = row["patched"] / (0.5 * (row["stock_a"] + row["stock_b"])) - 1
        ss.append(row)
        print(f"[jit-ss] M={M:5d} {row['cfg']:22s} stock={row['stock_a']:.2f}/{row['stock_b']:.2f}us "
              f"patched={row['patched']:.2f}us  d={row['patched_vs_stock'] * 100:+.1f}% noise={row['noise'] * 100:.1f}%",
              flush=True)
        ctx.drop_m(M)
    res["steady_state"] = ss
    dump(out, f"jit_{args.tag}.json", res)
    return res


def parse_cfg(sx: str) -> dict:
    m = re.fullmatch(r"M(\d+)N(\d+)K(\d+)G(\d+)w(\d+)s(\d+)(?:k(\d+))?(?:x([01]))?", sx)
    if not m:
        raise ValueError(f"bad config string {sx!r}")
    out = dict(zip(CFG_KEYS, map(int, m.groups()[:6])))
    if m.group(7):
        out["SPLIT_K"] = int(m.group(7))
    if m.group(8):
        out["SWAP_AB"] = m.group(8) == "1"
    return out


def mode_probe(args, kstock, dev, bw, out, pc):
    """Per-GEMM CUPTI times of given configs, swap-AB as vLLM decides / forced on
    / forced off: data for proposed kernel-side changes (relaxed swap rule,
    separate w13/w2 configs)."""
    cfgs = [parse_cfg(x) for x in args.probe_configs.split(",") if x]
    swaps = (None, True, False)
    for name in args.shapes:
        for M in args.ms:
            for c in cfgs:
                pc.submit(("probe", name, cfg_str(c), M), "stock", name, c, [M], swaps)
    rows = []
    for name in args.shapes:
        ctx = ShapeCtx(name, dev)
        for M in args.ms:
            for c in cfgs:
                pc.wait(("probe", name, cfg_str(c), M), args.t_end)
            for g in ("w13", "w2"):
                recs = []
                for c in cfgs:
                    for sw in swaps:
                        r = run_config(ctx, kstock, M, g, c, swap_ab=sw, reps=args.reps, want_graph=True)
                        r.update(shape=name, M=M, gemm=g, forced=str(sw), floor_us=ctx.floor_s(M, g, bw) * 1e6)
                        recs.append(r)
                attach_cupti(recs)
                rows += recs
                for r in recs:
                    print(f"[probe] {name:22s} M={M:5d} {g:3s} {r['cfg']:22s} forced={r['forced']:5s} swap={int(r['swap'])} "
                          f"cupti={r.get('cupti_us', float('nan')):8.2f}us graph={r['us']:8.2f}us ok={r['ok']} "
                          f"floor={r['floor_us']:.2f}", flush=True)
            ctx.drop_m(M)
        del ctx
        torch.cuda.empty_cache()
        dump(out, f"probe_{args.tag}.json", {"bw": bw, "rows": rows})
    return rows


def mode_smoke(args, kmod, dev, bw, out):
    """Correctness of one swap-eligible config on the given shapes: naive and
    aligned paths, swap-AB on and off, both GEMMs; plus one CUDA-graph timing."""
    ok_all = True
    c = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
         "num_stages": 3}
    for name in args.smoke_shapes:
        ctx = ShapeCtx(name, dev, max_sets=4)
        sh = ctx.shape
        for M in (1, 64):
            for swap in (None, False):
                for g in ("w13", "w2"):
                    ok, err = check(kmod, sh, g, ctx.get_inputs(M, 0), ctx.W[g], c, ctx.ref(M, g), swap)
                    ok_all &= ok
                    print(f"[smoke] {name} M={M} {g} {cfg_str(c)} swap={swap} ok={ok} relerr={err:.2e}", flush=True)
            r = run_config(ctx, kmod, M, "w13", c, want_graph=True)
            k = cupti_kernel_times([r.pop("_graph")])
            print(f"[smoke] timing {name} M={M} w13 graph={r['us']:.2f}us cupti={k[0]:.2f}us nsets={r['nsets']}",
                  flush=True)
            ctx.drop_m(M)
        del ctx
        torch.cuda.empty_cache()
    return ok_all


# ----------------------------------------------------------------------------
def default_stock_configs_dir(fused_moe_py):
    return os.path.join(os.path.dirname(os.path.abspath(fused_moe_py)), "configs")


def parse_plan(s):
    # "shape:M1,M2;shape2:all"
    plan = []
    for part in s.split(";"):
        if not part.strip():
            continue
        name, ms = part.split(":")
        if ms == "all":
            mm = TUNER_MS
        elif ms == "small":
            mm = [m for m in TUNER_MS if m <= 64]
        elif ms == "large":
            mm = [m for m in TUNER_MS if m > 64]
        else:
            mm = [int(x) for x in ms.split(",")]
        plan.append((name.strip(), mm))
    return plan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fused-moe-py", required=True, help="vLLM fused_moe.py (stock)")
    ap.add_argument("--patched-fused-moe-py", default=None, help="do_not_specialize-patched fused_moe.py")
    ap.add_argument("--stock-configs-dir", default=None, help="vLLM configs/ dir (default: beside fused_moe.py)")
    ap.add_argument("--configs-dir", default=None, help="our tuned configs (VLLM_TUNED_CONFIG_FOLDER)")
    ap.add_argument("--prev-configs-dir", default=None, help="bench: also time these configs (patched source)")
    ap.add_argument("--noswap", action="store_true", help="bench: also time stock/ours with swap-AB forced off")
    ap.add_argument("--mode", default="bench", help="comma list of: smoke,bench,tune,jit")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of shapes for bench/smoke")
    ap.add_argument("--smoke-shapes", default="qwen3-235b-tp8,deepseek-v3-tp8")
    ap.add_argument("--ms", default=",".join(map(str, TUNER_MS)), help="token counts for bench")
    ap.add_argument("--tune-plan", default=";".join(f"{s}:small" for s in TP8_SHAPES),
                    help="'shape:M,M;shape:small|large|all' in priority order")
    ap.add_argument("--tune-with", default="patched", choices=["stock", "patched"],
                    help="kernel source to tune (patched = what the image ships)")
    ap.add_argument("--space", default="default", choices=["default", "wide"],
                    help="wide: add BM=16 narrow-N / deep-K / 2-warp candidates where tokens/expert <= 1")
    ap.add_argument("--workers", type=int, default=14, help="parallel compile processes (0: none)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-cupti", action="store_true")
    ap.add_argument("--keep-all", action="store_true")
    ap.add_argument("--topk-cupti", type=int, default=3, help="tune: re-measure this many best configs with CUPTI")
    ap.add_argument("--seeds", type=int, default=4, help="gtune: variants of this many best base configs")
    ap.add_argument("--jit-shape", default="qwen3-235b-tp8")
    ap.add_argument("--jit-max-m", type=int, default=8192)
    ap.add_argument("--jit-use-ours", action="store_true", help="per-M dispatch from --configs-dir first")
    ap.add_argument("--jit-parts", default="fixed,dispatch,steady",
                    help="comma list of: fixed, dispatch, dispatch_ext (warm-up + every config key), steady")
    ap.add_argument("--probe-configs", default="",
                    help="probe mode: comma list of configs 'M16N32K128G1w4s5' timed on both GEMMs with "
                         "swap-AB as vLLM decides, forced on and forced off")
    ap.add_argument("--jit-ss-ms", default="1,2,3,4,5,8,16,17,33,64,100,256,511,1024,4096,8192")
    ap.add_argument("--budget-s", type=float, default=540, help="soft deadline for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tag", default="run")
    args = ap.parse_args(argv)
    args.t_end = time.time() + args.budget_s
    global SPACE
    SPACE = args.space
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.smoke_shapes = [s for s in args.smoke_shapes.split(",") if s]
    args.ms = [int(x) for x in args.ms.split(",") if x]
    args.jit_ss_ms = [int(x) for x in args.jit_ss_ms.split(",") if x]
    args.tune_plan = parse_plan(args.tune_plan)
    if args.stock_configs_dir is None:
        args.stock_configs_dir = default_stock_configs_dir(args.fused_moe_py)
    os.makedirs(args.out, exist_ok=True)
    gen_dir = os.path.join(tempfile.gettempdir(), "moe_bench_gen")
    os.environ.setdefault("MOE_BENCH_GEN_DIR", gen_dir)
    if "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_cache_main_")

    dev = torch.device("cuda")
    import triton

    props = torch.cuda.get_device_properties(0)
    kstock, sha_s = load_kernel(args.fused_moe_py, "stock")
    kpatched, sha_p = (load_kernel(args.patched_fused_moe_py, "patched") if args.patched_fused_moe_py
                       else (None, None))
    bw = measure_copy_bandwidth(dev)
    meta = {"device": props.name, "sms": props.multi_processor_count, "cap": torch.cuda.get_device_capability(),
            "torch": torch.__version__, "triton": triton.__version__, "copy_bw_TBps": bw / 1e12,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv, "stock_sha": sha_s,
            "patched_sha": sha_p, "stock_decorator": kernel_decorator_text(args.fused_moe_py),
            "patched_decorator": kernel_decorator_text(args.patched_fused_moe_py) if args.patched_fused_moe_py else None}
    print(f"[meta] {json.dumps(meta)}", flush=True)
    dump(args.out, f"meta_{args.tag}.json", meta)
    modes = args.mode.split(",")
    t0 = time.time()
    srcs = {"stock": args.fused_moe_py, "patched": args.patched_fused_moe_py or args.fused_moe_py}
    pc = Precompiler(args.workers, srcs)
    if "smoke" in modes:
        ok = mode_smoke(args, kstock, dev, bw, args.out)
        print(f"[smoke] all ok: {ok}  ({time.time() - t0:.0f}s)", flush=True)
    if "jit" in modes:
        assert kpatched is not None, "--patched-fused-moe-py needed for jit mode"
        mode_jit(args, kstock, kpatched, dev, bw, args.out)
        print(f"[jit] done ({time.time() - t0:.0f}s)", flush=True)
    if "tune" in modes:
        if args.tune_with == "patched" and args.patched_fused_moe_py:
            args.tune_tag, ktune = "patched", kpatched
        else:
            args.tune_tag, ktune = "stock", kstock
        mode_tune(args, ktune, dev, bw, args.out, pc)
        print(f"[tune] done ({time.time() - t0:.0f}s)", flush=True)
    if "gtune" in modes:
        assert kpatched is not None and hasattr(kpatched, "fused_moe_kernel_split_k"), \
            "gtune needs --patched-fused-moe-py with patches 0003/0004"
        mode_gemm_tune(args, kpatched, kstock, dev, bw, args.out, pc)
        print(f"[gtune] done ({time.time() - t0:.0f}s)", flush=True)
    if "probe" in modes:
        mode_probe(args, kstock, dev, bw, args.out, pc)
        print(f"[probe] done ({time.time() - t0:.0f}s)", flush=True)
    if "bench" in modes:
        mode_bench(args, kstock, kpatched, dev, bw, args.out, pc)
        print(f"[bench] done ({time.time() - t0:.0f}s)", flush=True)
    pc.close()
    print(f"[main] done ({time.time() - t0:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
