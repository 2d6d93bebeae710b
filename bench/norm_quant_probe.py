"""H200 probe: one decode step's RMSNorm (with its residual add) and per-128-group FP8 quantization before a block-FP8
linear layer, as torch.compile generates them from the native ops, fused into one compiled function and as two.

    python3 bench/norm_quant_probe.py --out DIR [--hidden 6144 4096] [--tokens 1 2 8]

vLLM 0.32 fuses this pair into one CUDA kernel (`rms_norm_per_block_quant_kernel`, its fuse_norm_quant pass): 7.6 µs
a call at hidden 6,144 and one token in the engine on the H200 (bench/RESULTS-archive.md, run 22's profile), 5.7 µs
at 4,096 (run 15). `option.norm_quant_fusion=false` turns that pass off. This probe runs on the GPU host's own torch
and Triton (no wheelhouse), where vLLM is not installed: it gives the generated kernels' CUPTI durations (the clock
the engine bench's profile uses) for the same work, not a side-by-side figure with vLLM's kernel. Each compiled
result is checked against the eager functions first. Writes DIR/norm_quant_probe.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

GROUP = 128
EPS = 1e-6


def rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's RMSNorm with a residual, native form: (normalized, new residual)."""
    r = x.float() + residual.float()
    new_residual = r.to(x.dtype)
    y = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight
    return y, new_residual


def group_quant(y: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group FP8 quantization (vLLM's formula): (values, float32 scales per group of 128)."""
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    g = y.float().view(y.shape[0], -1, GROUP)
    s = g.abs().amax(-1).clamp_min(1e-10) * (1.0 / fp8_max)
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (g / s[..., None]).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
    return q.view_as(y), s


def norm_then_quant(x, residual, weight):
    y, new_residual = rms_norm(x, residual, weight)
    q, s = group_quant(y)
    return q, s, new_residual


def kernel_us(fn, args, calls: int = 50) -> tuple[float, dict[str, float]]:
    """CUPTI kernel time of one call (µs, summed over its kernels) and each kernel's share, from `calls` calls."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            per[e.name[:80]] = per.get(e.name[:80], 0.0) + e.device_time_total / calls
    return sum(per.values()), per


def relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error of a against b (FP8 values compared as floats): the compiled kernels sum in their own order, so
    a value may round to the next FP8 step."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def probe(hidden: int, tokens: int, dev, timed: bool = True) -> dict:
    gen = torch.Generator(device=dev).manual_seed(hidden + tokens)
    x = torch.randn(tokens, hidden, device=dev, generator=gen).to(torch.bfloat16)
    residual = torch.randn(tokens, hidden, device=dev, generator=gen).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, device=dev, generator=gen)).to(torch.bfloat16)
    args = (x, residual, weight)
    fused = torch.compile(norm_then_quant, fullgraph=True, dynamic=False)
    norm_c = torch.compile(rms_norm, fullgraph=True, dynamic=False)
    quant_c = torch.compile(group_quant, fullgraph=True, dynamic=False)
    want = norm_then_quant(*args)
    got = fused(*args)
    y, _ = norm_c(*args)
    two = quant_c(y)
    row = {"hidden": hidden, "tokens": tokens,
           "fused_relerr": [relerr(a, b) for a, b in zip(got, want)],
           "two_relerr": [relerr(two[0], want[0]), relerr(two[1], want[1])]}
    if timed:
        row["fused_us"], row["fused_kernels"] = kernel_us(fused, args)
        row["norm_us"], row["norm_kernels"] = kernel_us(norm_c, args)
        row["quant_us"], row["quant_kernels"] = kernel_us(quant_c, (y,))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hidden", type=int, nargs="+", default=[6144, 4096])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 8])
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("no CUDA device: this probe times kernels on the GPU")
    dev = torch.device("cuda")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| hidden | tokens | one compiled function (µs, kernels) | norm (µs) + quantization (µs) | relative error against eager |")
    print("|---|---|---|---|---|")
    for hidden in a.hidden:
        for tokens in a.tokens:
            r = probe(hidden, tokens, dev)
            rows.append(r)
            print(f"| {hidden} | {tokens} | {r['fused_us']:.2f} ({len(r['fused_kernels'])}) | {r['norm_us']:.2f} + "
                  f"{r['quant_us']:.2f} | {max(r['fused_relerr'] + r['two_relerr']):.4f} |", flush=True)
            (a.out / "norm_quant_probe.json").write_text(json.dumps(
                {"torch": torch.__version__, "triton": __import__("triton").__version__,
                 "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
