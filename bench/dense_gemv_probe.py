"""H200 probe: the block-FP8 dense GEMMs of a decode step of 1-4 tokens as matrix-vector products on CUDA cores,
against the kernels the engine runs there, for the attention GEMMs of the EP8 shards.

    python3 bench/dense_gemv_probe.py --out DIR [--shapes coder-qkv coder-o-proj ...] [--ms 1 2 4]
        [--fp8-utils-py PATCHED/fp8_utils.py]

At one token the Qwen3-Coder EP8 shard's qkv (N=14,336, K=6,144) and o_proj (N=6,144, K=12,288) run vLLM's CUTLASS
blockwise kernel at 24.4 and 22.4 µs (run 18's decode GEMM bench): 88 and 75 MB of FP8 weights at 3.4-3.6 TB/s,
against about 4.4 TB/s the H200 reads. This kernel gives each program BLOCK_N weight rows (BLOCK_N divides the
128-row scale block) and streams them over its share of K (SPLIT_K shares; float32 atomics into a zeroed buffer,
then a cast, where SPLIT_K > 1) in BLOCK_K-wide steps, the per-token-group activation scales and the weight block
scales applied per 128-column group, each token's row of the output kept in registers.

Runs on the GPU host's own torch and Triton (no wheelhouse, no vLLM). Side by side, in CUDA graphs over rotating
weight sets larger than L2 (bench/moe/timing.time_graph): torch's blockwise-scaled `_scaled_mm` (CUTLASS, where this
torch has it), patch 0010's split-K Triton kernel cut from the given patched fp8_utils.py (its best config of a
small grid), and this kernel's best config of a space of them (--space). Every candidate is checked against a
float32 reference first. Writes DIR/dense_gemv_probe.json and prints a table with the memory floor at the measured
copy rate.
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
import triton.language as tl  # noqa: E402

GROUP = 128
FP8 = torch.float8_e4m3fn
TOLERANCE = 2e-2  # relative Frobenius error against the float32 reference: fp8 products summed over K >= 1,024

# (N, K) of one rank's attention GEMMs: the Qwen3-Coder EP8 rank (all 96 query heads and 8 KV heads: N = (96 + 2 x 8)
# x 128), the Qwen3-235B EP8 rank (TP8 heads: 8 query heads and one KV head: N = (8 + 2) x 128), DeepSeek-V3's EP8
# rank's fused q/kv down-projection
SHAPES = {
    "coder-qkv": (14336, 6144),
    "coder-o-proj": (6144, 12288),
    "235b-qkv": (1280, 4096),
    "235b-o-proj": (4096, 1024),
    "deepseek-v3-qkv": (2304, 7168),
}
# This kernel's configs: BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages
SPACES = {
    "narrow": [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=2)
               for bn, bk, sk, w in itertools.product((8, 16, 32), (256, 512), (1, 2), (4, 8))],
    "wide": [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st)
             for bn, bk, sk, w, st in itertools.product((4, 8, 16), (1024, 2048), (1, 2), (4, 8), (1, 3))],
    "long-k": [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=1, num_warps=w, num_stages=st)
               for bn, bk, w, st in itertools.product((2, 4, 8), (2048, 4096), (4, 8), (1, 2, 3))],
}


@triton.jit
def block_fp8_gemv_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, K,
    stride_am, stride_asm, stride_bn, stride_bsn, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    # C[m, n] = sum_k A[m, k] B[n, k] As[m, k // 128] Bs[n // 128, k // 128]; one program: BLOCK_N rows of B over
    # K / SPLIT_K columns, every token (BLOCK_M >= M rows of A) at once
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    G: tl.constexpr = BLOCK_K // GROUP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    b_rows = b_ptr + offs_n[:, None].to(tl.int64) * stride_bn
    bs_row = bs_ptr + (pid_n * BLOCK_N) // GROUP_K * stride_bsn  # BLOCK_N divides 128: one row of block scales
    k_share = K // SPLIT_K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(pid_k * k_share, (pid_k + 1) * k_share, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        g = k0 // GROUP_K + tl.arange(0, G)
        b = tl.load(b_rows + offs_k[None, :]).to(tl.float32)  # [BLOCK_N, BLOCK_K]
        bs = tl.load(bs_row + g)  # [G]
        for m in tl.static_range(BLOCK_M):
            # a token row past M (BLOCK_M is M's next power of two) reads zeros
            a = tl.load(a_ptr + m * stride_am + offs_k, mask=offs_k < K * (M > m), other=0.0).to(tl.float32)
            a_s = tl.load(as_ptr + m * stride_asm + g, mask=g < (K // GROUP_K) * (M > m), other=0.0)
            part = tl.sum(tl.reshape(b * a[None, :], (BLOCK_N, G, GROUP_K)), axis=2)  # [BLOCK_N, G]
            row = tl.sum(part * (bs * a_s)[None, :], axis=1)  # [BLOCK_N]
            acc = tl.where(offs_m[:, None] == m, acc + row[None, :], acc)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None])
    else:
        tl.atomic_add(c_ptrs, acc, mask=m_ok[:, None], sem="relaxed")


def check_config(config: dict, N: int, K: int) -> bool:
    """Whether the config tiles (N, K): BLOCK_N divides 128 and N, each of SPLIT_K shares of K is whole BLOCK_Ks."""
    bn, bk, sk = config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    return GROUP % bn == 0 and N % bn == 0 and bk % GROUP == 0 and K % (sk * bk) == 0


def block_fp8_gemv(a, a_s, b, b_s, config: dict, out_dtype=torch.bfloat16) -> torch.Tensor:
    """A [M, K] FP8 with per-token-group scales As [M, K / 128] times B [N, K] FP8 with block scales Bs [N / 128,
    K / 128] (all row-major), with one config of SPACES."""
    M, K = a.shape
    N = b.shape[0]
    split_k = config["SPLIT_K"]
    c = torch.zeros((M, N), dtype=torch.float32, device=a.device) if split_k > 1 else \
        torch.empty((M, N), dtype=out_dtype, device=a.device)
    block_fp8_gemv_kernel[(N // config["BLOCK_N"], split_k)](
        a, a_s, b, b_s, c, M, K, a.stride(0), a_s.stride(0), b.stride(0), b_s.stride(0), c.stride(0),
        BLOCK_M=triton.next_power_of_2(M), BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], GROUP_K=GROUP,
        SPLIT_K=split_k, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return c if split_k == 1 else c.to(out_dtype)


def make_problem(N: int, K: int, M: int, dev, gen: torch.Generator, sets: int = 1):
    """A quantized activation (M tokens) and `sets` weight sets of (N, K), block FP8 with random scales."""
    fmax = torch.finfo(FP8).max
    x = torch.randn(M, K, generator=gen, device=dev)
    xg = x.view(M, K // GROUP, GROUP)
    a_s = (xg.abs().amax(-1).clamp(min=1e-10) / fmax).float()
    a = (xg / a_s[..., None]).clamp(-fmax, fmax).view(M, K).to(FP8)
    weights = []
    for _ in range(sets):
        b = (torch.randn(N, K, generator=gen, device=dev) * 0.5).to(FP8)
        b_s = (torch.rand(N // GROUP, K // GROUP, generator=gen, device=dev) * 0.01 + 0.005).float()
        weights.append((b, b_s))
    return a, a_s.contiguous(), weights


def reference(a, a_s, b, b_s) -> torch.Tensor:
    """The float32 product of the dequantized operands."""
    M, K = a.shape
    N = b.shape[0]
    ad = (a.float().view(M, K // GROUP, GROUP) * a_s[..., None]).view(M, K)
    bd = (b.float().view(N // GROUP, GROUP, K // GROUP, GROUP) * b_s[:, None, :, None]).view(N, K)
    return ad @ bd.t()


def relerr(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp(min=1e-20)).item()


def scaled_mm_fn(a, a_s, b, b_s):
    """torch's blockwise-scaled FP8 GEMM (1x128 activation groups, 128x128 weight blocks), or None where this torch
    does not run it."""
    def run():
        # CUTLASS's blockwise layout: the activation scales M-major (a column-major [M, K / 128])
        return torch._scaled_mm(a, b.t(), scale_a=a_s.t().contiguous().t(), scale_b=b_s.t(), out_dtype=torch.bfloat16)
    try:
        ok = relerr(run(), reference(a, a_s, b, b_s)) < TOLERANCE
    except (RuntimeError, TypeError, ValueError):
        return None
    return run if ok else None


def load_small_m(fp8_utils_py: str):
    """Patch 0010's split-K kernel and launcher cut from a patched fp8_utils.py (bench/moe/kernel_source)."""
    from bench.moe.kernel_source import load_definitions
    return load_definitions(fp8_utils_py, ("_lmi_block_fp8_mm_small_m", "lmi_block_fp8_small_m_mm"), "small_m")


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["coder-qkv", "coder-o-proj"])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--space", choices=list(SPACES), default="narrow",
                   help="this kernel's configs: narrow (24), wide (48, longer K steps) or long-k (36, K steps of 2,048-4,096)")
    p.add_argument("--fp8-utils-py", help="a patched fp8_utils.py: patch 0010's split-K kernel as a third arm")
    args = p.parse_args(argv)
    from bench.moe.timing import measure_copy_bandwidth, time_graph

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    copy_bw = measure_copy_bandwidth(dev)
    small_m = load_small_m(args.fp8_utils_py) if args.fp8_utils_py else None
    rows = []
    for name in args.shapes:
        N, K = SHAPES[name]
        # weight sets over 200 MB, so that each call reads its weights from HBM, not L2
        sets = max(2, -(-(200 << 20) // (N * K)))
        for M in args.ms:
            a, a_s, weights = make_problem(N, K, M, dev, gen, sets)
            ref = reference(a, a_s, *weights[0])
            row = {"shape": name, "N": N, "K": K, "M": M, "floor_us": 1e6 * N * K / copy_bw}
            mm = scaled_mm_fn(a, a_s, *weights[0])
            if mm is not None:
                row["scaled_mm_us"] = time_graph([lambda b=b, bs=bs: torch._scaled_mm(
                    a, b.t(), scale_a=a_s.t().contiguous().t(), scale_b=bs.t(), out_dtype=torch.bfloat16)
                    for b, bs in weights])[0]
            if small_m is not None:
                row["small_m"] = best(SMALL_M_SPACE, lambda c, b, bs: small_m.lmi_block_fp8_small_m_mm(
                    a, b, a_s, bs, [GROUP, GROUP], c, torch.bfloat16), ref, weights, time_graph)
            row["gemv"] = best([c for c in SPACES[args.space] if check_config(c, N, K)],
                               lambda c, b, bs: block_fp8_gemv(a, a_s, b, bs, c), ref, weights, time_graph)
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
        sm, g = r.get("small_m"), r.get("gemv")
        print(f"| {r['shape']} | {r['M']} | {r['floor_us']:.1f} | {r.get('scaled_mm_us', float('nan')):.2f} | "
              f"{sm['us'] if sm else float('nan'):.2f} | "
              f"{g['us'] if g else float('nan'):.2f} ({g['config'] if g else '-'}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
