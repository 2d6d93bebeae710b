"""H200 probe: patch 0010's matrix-vector kernel for the block-FP8 dense GEMMs of a decode step (a small-M entry
holding a GEMV dict) against the tier's split-K kernel and torch's blockwise `_scaled_mm`, for the EP8 shards'
attention GEMMs at 1-4 tokens.

    python3 bench/dense_gemv_probe.py --fp8-utils-py PATCHED/fp8_utils.py --out DIR
        [--shapes coder-qkv coder-o-proj ...] [--ms 1 2 4] [--space long-k]
    python3 bench/dense_gemv_probe.py --candidates-from DIR/dense_gemv_probe.json ... --out CANDIDATES

At one token the Qwen3-Coder EP8 shard's qkv (N=14,336, K=6,144) and o_proj (N=6,144, K=12,288) run vLLM's CUTLASS
blockwise kernel at 24.4 and 22.4 µs (run 18's decode GEMM bench): 88 and 75 MB of FP8 weights at 3.4-3.6 TB/s. The
GEMV kernel gives each program BLOCK_SIZE_N weight rows (dividing the 128-row scale block) and streams them over K
in BLOCK_SIZE_K-wide steps on CUDA cores, the per-token-group and block scales applied per 128-column group.

Runs on the GPU host's own torch and Triton (no wheelhouse, no vLLM): both of the tier's kernels and launchers are
cut out of the given patched fp8_utils.py (bench/moe/kernel_source). Side by side, in CUDA graphs over rotating
weight sets larger than L2 (bench/moe/timing.time_graph): torch's blockwise-scaled `_scaled_mm` (CUTLASS, where this
torch runs it), the split-K kernel's best config of a small grid, and the best GEMV dict of --space. Every candidate
is checked against a float32 reference first. Writes DIR/dense_gemv_probe.json and prints a table with the memory
floor at the measured copy rate.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from bench.moe.problem import dequant_a, dequant_w, n_sets_for  # noqa: E402
from bench.norm_quant_probe import group_quant  # noqa: E402
from bench.small_m_configs import file_name as small_m_file_name  # noqa: E402

GROUP = 128
FP8 = torch.float8_e4m3fn
TOLERANCE = 2e-2  # relative Frobenius error against the float32 reference: fp8 products summed over K >= 1,024
MAX_WEIGHT_SETS = 64  # the 235B's o_proj (4 MB) takes 45 for three times L2

# (N, K) of one rank's attention GEMMs: the Qwen3-Coder EP8 rank (all 96 query heads and 8 KV heads: N = (96 + 2 x 8)
# x 128), the Qwen3-235B EP8 rank (TP8 heads: 8 query heads and one KV head: N = (8 + 2) x 128), the DeepSeek-V3 EP8
# shard's (TP8 heads of its Qwen3 attention: 16 query heads and one KV head, N = (16 + 2) x 128, o_proj K = 16 x 128)
SHAPES = {
    "coder-qkv": (14336, 6144),
    "coder-o-proj": (6144, 12288),
    "235b-qkv": (1280, 4096),
    "235b-o-proj": (4096, 1024),
    "deepseek-v3-qkv": (2304, 7168),
    "deepseek-v3-o-proj": (7168, 2048),
}
PROBED_BY_DEFAULT = ("coder-qkv", "coder-o-proj")  # --shapes when a probe is not given it
# Patch 0010's GEMV dicts to try (kernel probe 24b's best at one token: 4 rows and K steps of 2,048 for the Coder's
# qkv, 8 and 4,096 for its o_proj, 8 and 512 for the 235B's o_proj; a split of K never won there)
SPACES = {
    "narrow": [dict(BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, num_warps=w, num_stages=2)
               for bn, bk, w in itertools.product((8, 16, 32), (256, 512), (4, 8))],
    "long-k": [dict(BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, num_warps=w, num_stages=st)
               for bn, bk, w, st in itertools.product((2, 4, 8), (1024, 2048, 4096), (4, 8), (1, 2, 3))],
}


def weight_set_count(N: int, K: int) -> int:
    """How many (N, K) FP8 weight sets a graph's calls take in turn: together over three times L2 (the kernel
    harness's rotation), so that each call reads its weights from HBM, as a decode step does, not from L2."""
    return n_sets_for(N * K, N * K, MAX_WEIGHT_SETS)


def gemv_tiles(gemv: dict, N: int, K: int) -> bool:
    """Whether a GEMV dict tiles (N, K) as patch 0010's lmi_check_gemv_entry requires of [128, 128] blocks:
    BLOCK_SIZE_N a power of two dividing 128 and N, BLOCK_SIZE_K a power of two of whole groups dividing K."""
    bn, bk = gemv["BLOCK_SIZE_N"], gemv["BLOCK_SIZE_K"]
    return not (bn & (bn - 1) or GROUP % bn or N % bn or bk & (bk - 1) or bk % GROUP or K % bk)


def make_problem(N: int, K: int, M: int, dev, gen: torch.Generator, sets: int = 1):
    """A quantized activation (M tokens) and `sets` weight sets of (N, K), block FP8 with random scales."""
    a, a_s = group_quant(torch.randn(M, K, generator=gen, device=dev))
    weights = []
    for _ in range(sets):
        b = (torch.randn(N, K, generator=gen, device=dev) * 0.5).to(FP8)
        b_s = (torch.rand(N // GROUP, K // GROUP, generator=gen, device=dev) * 0.01 + 0.005).float()
        weights.append((b, b_s))
    return a, a_s.contiguous(), weights


def reference(a, a_s, b, b_s) -> torch.Tensor:
    """The float32 product of the dequantized operands."""
    block = [GROUP, GROUP]
    return dequant_a(a, a_s, block) @ dequant_w(b[None], b_s[None], block)[0].t()


def relerr(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp(min=1e-20)).item()


def load_tier(fp8_utils_py: str):
    """Patch 0010's split-K and GEMV kernels and their launchers cut from a patched fp8_utils.py
    (bench/moe/kernel_source)."""
    from bench.moe.kernel_source import load_definitions
    return load_definitions(fp8_utils_py, ("LMI_GEMV_KEY", "_lmi_block_fp8_mm_small_m", "lmi_block_fp8_small_m_mm",
                                           "_lmi_block_fp8_gemv", "lmi_block_fp8_gemv"), "small_m")


# patch 0010's configs around its best ones for the Coder's GEMMs at one token (run 18: N128 with K/4 and K/8)
SMALL_M_SPACE = [dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=128, SPLIT_K=sk, num_warps=4, num_stages=3)
                 for bn, sk in itertools.product((64, 128), (4, 8))]


def best(candidates: list[dict], make, ref, weights, time_graph) -> dict | None:
    """The fastest config of candidates that passes the reference check: make(config, b, b_s) is the call."""
    b0, bs0 = weights[0]
    top = None
    for config in candidates:
        try:
            err = relerr(make(config, b0, bs0), ref)
        except Exception as ex:  # noqa: BLE001  (OutOfResources, a shape the config cannot tile)
            err = repr(ex)[:120]
        if not isinstance(err, float) or err >= TOLERANCE:
            continue
        us = time_graph([lambda b=b, bs=bs: make(config, b, bs) for b, bs in weights])[0]
        if top is None or us < top["us"]:
            top = {"config": config, "us": us, "relerr": err}
    return top


def as_gemv_dict(config: dict) -> dict | None:
    """A probe's best GEMV config as patch 0010's GEMV dict. Kernel probe 24b's records name its first kernel's keys
    (BLOCK_N, BLOCK_K, SPLIT_K); a config that split K has no GEMV dict (the patch's kernel does not split)."""
    if "BLOCK_SIZE_N" in config:
        return dict(config)
    if config.get("SPLIT_K", 1) != 1:
        return None
    return {"BLOCK_SIZE_N": config["BLOCK_N"], "BLOCK_SIZE_K": config["BLOCK_K"], "num_warps": config["num_warps"],
            "num_stages": config["num_stages"]}


def candidate_files(probes: list[dict], configs_dir: Path, out: Path, shapes: list[str] | None = None) -> list[Path]:
    """Small-M files for the engine bench's image-candidates arm: for each (shape, tokens) whose best GEMV dict over
    the given probes beat the split-K kernel's best in the same probe, the shipped file of the shape (configs_dir)
    with a GEMV entry at that token count, or a file holding that entry alone; only the named shapes' (SHAPES), if
    given. Written to out; returns their paths."""
    best_rows: dict[tuple[int, int, int], dict] = {}
    for res in probes:
        for r in res["rows"]:
            if shapes is not None and r["shape"] not in shapes:
                continue
            g, sm = r.get("gemv"), r.get("small_m")
            if g and as_gemv_dict(g["config"]) and (sm is None or g["us"] < sm["us"]):
                key = (r["N"], r["K"], r["M"])
                if key not in best_rows or g["us"] < best_rows[key]["gemv"]["us"]:
                    best_rows[key] = {**r, "device": res["device"]}
    files: dict[Path, dict] = {}
    for (N, K, M), r in sorted(best_rows.items()):
        name = small_m_file_name(N, K, r["device"])
        path = out / name
        if path not in files:
            shipped = configs_dir / name
            files[path] = json.loads(shipped.read_text()) if shipped.exists() else {}
        files[path][str(M)] = {"GEMV": as_gemv_dict(r["gemv"]["config"])}
    out.mkdir(parents=True, exist_ok=True)
    for path, entries in files.items():
        flags = {k: v for k, v in entries.items() if not k.isdigit()}
        counts = {k: entries[k] for k in sorted((k for k in entries if k.isdigit()), key=int)}
        path.write_text(json.dumps({**flags, **counts}, indent=4) + "\n")
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--candidates-from", type=Path, nargs="+", metavar="JSON",
                   help="no GPU: write to --out the small-M candidate files of these probes' results "
                        "(candidate_files), laid over --configs-dir's")
    p.add_argument("--configs-dir", type=Path, default=ROOT / "configs")
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES),
                   help="the shapes to probe (default: coder-qkv coder-o-proj), or with --candidates-from, the shapes "
                        "to write files for (default: every shape the probes hold)")
    p.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--space", choices=list(SPACES), default="long-k",
                   help="the GEMV dicts to try: narrow (12, short K steps) or long-k (54, K steps of 1,024-4,096)")
    p.add_argument("--fp8-utils-py", help="a patched fp8_utils.py (patch 0010's kernels; needed to probe)")
    args = p.parse_args(argv)
    if args.candidates_from:
        for path in candidate_files([json.loads(f.read_text()) for f in args.candidates_from], args.configs_dir,
                                    args.out, args.shapes):
            print(path)
        return 0
    if not args.fp8_utils_py:
        p.error("--fp8-utils-py is needed to probe (or --candidates-from, to write candidate files)")
    from bench.moe.timing import measure_copy_bandwidth, time_graph

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    copy_bw = measure_copy_bandwidth(dev)
    tier = load_tier(args.fp8_utils_py)
    rows = []
    for name in args.shapes or PROBED_BY_DEFAULT:
        N, K = SHAPES[name]
        sets = weight_set_count(N, K)
        for M in args.ms:
            a, a_s, weights = make_problem(N, K, M, dev, gen, sets)
            ref = reference(a, a_s, *weights[0])
            row = {"shape": name, "N": N, "K": K, "M": M, "floor_us": 1e6 * N * K / copy_bw}
            # torch's blockwise-scaled FP8 GEMM (1x128 activation groups, 128x128 weight blocks), where this torch
            # runs it; CUTLASS's layout: the activation scales M-major (a column-major [M, K / 128])
            a_s_cols = a_s.t().contiguous().t()
            row["scaled_mm"] = best([None], lambda c, b, bs: torch._scaled_mm(
                a, b.t(), scale_a=a_s_cols, scale_b=bs.t(), out_dtype=torch.bfloat16), ref, weights, time_graph)
            row["small_m"] = best(SMALL_M_SPACE, lambda c, b, bs: tier.lmi_block_fp8_small_m_mm(
                a, b, a_s, bs, [GROUP, GROUP], c, torch.bfloat16), ref, weights, time_graph)
            row["gemv"] = best([c for c in SPACES[args.space] if gemv_tiles(c, N, K)],
                               lambda c, b, bs: tier.lmi_block_fp8_gemv(a, b, a_s, bs, [GROUP, GROUP], c,
                                                                        torch.bfloat16), ref, weights, time_graph)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del weights
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bytes_per_s": copy_bw, "rows": rows}
    (args.out / "dense_gemv_probe.json").write_text(json.dumps(result, indent=1))
    print("| shape | tokens | floor µs | torch _scaled_mm µs | 0010 split-K µs | GEMV µs (config) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mm, sm, g = r.get("scaled_mm"), r.get("small_m"), r.get("gemv")
        print(f"| {r['shape']} | {r['M']} | {r['floor_us']:.1f} | {mm['us'] if mm else float('nan'):.2f} | "
              f"{sm['us'] if sm else float('nan'):.2f} | "
              f"{g['us'] if g else float('nan'):.2f} ({g['config'] if g else '-'}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
