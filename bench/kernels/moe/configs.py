"""Fused-MoE configs as vLLM 0.32 picks them, and how the harness writes them.

vLLM's lookup (tuned folder first, then vLLM's own configs/, nearest key, else
the fp8 default; ONE config per M shared by w13 and w2 unless patch 0003's
per-GEMM dicts say otherwise): the file name, folders, nearest entry and
per-GEMM resolution are serving/vllm_patches/moe_configs.py's;
``get_default_config`` mirrors fused_moe.py's CUDA branch.
"""
from __future__ import annotations

import os
import re

from serving.vllm_patches.moe_configs import GEMM_NAMES, GEMV_KEY, gemm_config, get_moe_configs, nearest_config


CFG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


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
    """An entry's tile configs: the flat one, or each GEMM's where a per-GEMM dict changes a tile key (a GEMV dict
    alone does not: it configures patch 0011's kernel, not the GEMM's tiles)."""
    if not any(set(entry.get(g, {})) - {GEMV_KEY} for g in GEMM_NAMES):
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
