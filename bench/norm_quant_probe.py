"""H200 probe: one decode step's RMSNorm (with its residual add) and per-128-group FP8 quantization before a block-FP8
linear layer, and the RMSNorm alone (the one before the MoE), as torch.compile generates them from the native ops,
compiled as a graph for the size at hand or as one graph for every size, with Inductor's options of each variant.

    python3 bench/norm_quant_probe.py --out DIR [--hidden 6144 4096] [--tokens 1 2 8] [--variants NAME ...]

vLLM 0.32 fuses the norm and the quantization into one CUDA kernel (`rms_norm_per_block_quant_kernel`, its
fuse_norm_quant pass): 7.6 µs a call at hidden 6,144 and one token in the engine on the H200 (bench/RESULTS-archive.md,
run 22's profile). With `option.norm_quant=compiled` (the image's default) torch.compile generates them: 4.6 µs in two
kernels in the engine (run 23), where this probe's graph for one token took 2.9 (kernel probe 22c). vLLM compiles one
graph for every batch size (the batch dimension unbacked: no recompile, no guard on it), whose kernels Inductor tunes
at its fallback size hint, unless compilation_config.compile_sizes names the size; the variants here are those two
forms, each also with Inductor's cooperative reductions (a long reduction of few rows split over several programs).
The probe runs on the GPU host's own torch and Triton (no wheelhouse), where vLLM is not installed: it gives the
generated kernels' CUPTI durations (the clock the engine bench's profile uses), not a side-by-side figure with vLLM's
kernel. Each compiled result is checked against the eager functions first. Writes DIR/norm_quant_probe.json and prints
a table.
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


# name -> (one graph for every batch size, Inductor options)
VARIANTS = {
    "this size": (False, {}),
    "every size": (True, {}),
    "this size, cooperative": (False, {"triton.cooperative_reductions": True}),
    "every size, cooperative": (True, {"triton.cooperative_reductions": True}),
}
EVERY_SIZE_EXAMPLE = 64  # the batch size the one-for-every-size graph is traced at (its kernels: any size)


def compiled(fn, every_size: bool, options: dict, example: tuple):
    """fn compiled as a graph for the size of the arguments it is called with, or as one graph for every batch size,
    traced on `example` (whose first two tensors' batch dimension is then unbacked, as vLLM's is)."""
    from torch._dynamo.decorators import mark_unbacked
    c = torch.compile(fn, fullgraph=True, dynamic=None if every_size else False, options=options)
    if every_size:
        for t in example[:2]:
            mark_unbacked(t, 0)
        c(*example)
    return c


def inputs(hidden: int, tokens: int, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=dev).manual_seed(hidden + tokens)
    x = torch.randn(tokens, hidden, device=dev, generator=gen).to(torch.bfloat16)
    residual = torch.randn(tokens, hidden, device=dev, generator=gen).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, device=dev, generator=gen)).to(torch.bfloat16)
    return x, residual, weight


def probe(hidden: int, tokens: int, dev, variant: str = "this size", timed: bool = True) -> dict:
    every_size, options = VARIANTS[variant]
    torch._dynamo.reset()  # no graph of another variant is found in Dynamo's cache for these functions
    args = inputs(hidden, tokens, dev)
    example = inputs(hidden, EVERY_SIZE_EXAMPLE, dev) if every_size else ()
    fused = compiled(norm_then_quant, every_size, options, example)
    norm_c = compiled(rms_norm, every_size, options, example)
    want, want_norm = norm_then_quant(*args), rms_norm(*args)
    got, got_norm = fused(*args), norm_c(*args)
    row = {"hidden": hidden, "tokens": tokens, "variant": variant,
           "fused_relerr": [relerr(a, b) for a, b in zip(got, want)],
           "norm_relerr": [relerr(a, b) for a, b in zip(got_norm, want_norm)]}
    if timed:
        row["fused_us"], row["fused_kernels"] = kernel_us(fused, args)
        row["norm_us"], row["norm_kernels"] = kernel_us(norm_c, args)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hidden", type=int, nargs="+", default=[6144, 4096])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 8])
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("no CUDA device: this probe times kernels on the GPU")
    dev = torch.device("cuda")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| hidden | tokens | compiled as | norm + quantization (µs, kernels) | norm alone (µs, kernels) | "
          "relative error against eager |")
    print("|---|---|---|---|---|---|")
    for hidden in a.hidden:
        for tokens in a.tokens:
            for variant in a.variants:
                try:
                    r = probe(hidden, tokens, dev, variant)
                except Exception as e:  # noqa: BLE001  (a variant this torch cannot compile: recorded, the rest go on)
                    r = {"hidden": hidden, "tokens": tokens, "variant": variant, "error": repr(e)[:300]}
                    print(f"| {hidden} | {tokens} | {variant} | failed: {r['error'][:80]} | | |", flush=True)
                else:
                    print(f"| {hidden} | {tokens} | {variant} | {r['fused_us']:.2f} ({len(r['fused_kernels'])}) | "
                          f"{r['norm_us']:.2f} ({len(r['norm_kernels'])}) | "
                          f"{max(r['fused_relerr'] + r['norm_relerr']):.4f} |", flush=True)
                rows.append(r)
                (a.out / "norm_quant_probe.json").write_text(json.dumps(
                    {"torch": torch.__version__, "triton": __import__("triton").__version__,
                     "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
