"""The search space: candidate configs per (shape, M), the per-GEMM variants
(split-K, swap-AB off) of a base config, and the token counts that reach each
compiled code variant.
"""
from __future__ import annotations

import itertools

from .configs import cfg_str
from .launch import enable_swap_ab, naive_assignment
from .shapes import gemm_dims


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


def candidate_configs(shape, M, space="default") -> list[dict]:
    """The configs tried for (shape, M); space "wide" adds wide_decode_configs where
    tokens/expert <= 1."""
    if space == "wide" and M * shape["topk"] / shape["E"] <= 1:
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


def compile_variant_ms(shape, Ms):
    """Representative Ms hitting each code variant (naive / aligned, M<BM)."""
    E, topk = shape["E"], shape["topk"]
    reps = {}
    for M in Ms:
        naive = naive_assignment(M, E, topk)
        reps.setdefault(naive, M)
    return sorted(reps.values())
