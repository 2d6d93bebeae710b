"""H200 probe: patch 0011's decode fused-MoE kernel (matrix-vector products) against vLLM's fused_moe_kernel with the
shipped config, side by side in one process, for the block-FP8 EP8 ranks at 1-4 tokens.

    python3 bench/moe_gemv_probe.py --fused-moe-py PATCHED/fused_moe.py --out DIR \
        [--shapes qwen3-coder-480b-ep8 qwen3-235b-ep8 deepseek-v3-ep8] [--ms 1 2 4]

Runs on the GPU host's own torch and Triton (no wheelhouse). Both kernels are cut out of the given fused_moe.py
(the series applied) as the kernel harness does (bench/moe/): vLLM's with the entry `configs/` holds for the shape
and token count, 0011's launcher with each config of bench/moe/gemv_space.py, checked against the harness's float32
reference before it is timed. Times are per launch, from CUDA graphs of launches over rotating weight sets larger than L2 (the harness's
time_graph). Writes DIR/gemv_probe.json and prints a table: vLLM's time, the candidate's best and its config, their
ratio, and the memory floor at the measured copy rate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.moe.configs import cfg_str, gemm_config, try_get_config  # noqa: E402
from bench.moe.gemv_space import candidate_configs  # noqa: E402
from bench.moe.kernel_source import load_definitions, load_kernel  # noqa: E402
from bench.moe.problem import ShapeCtx  # noqa: E402
from bench.moe.timing import measure_copy_bandwidth, run_config, time_graph  # noqa: E402

TOLERANCE = 5e-2  # the harness's (bench/moe/problem.check): fp8 products summed over K=2,560-7,168


# Patch 0011's definitions the probe runs (its launcher checks the config and launches the kernel)
GEMV_DEFINITIONS = ("LMI_MOE_DECODE_GEMV_ENV", "_LMI_GEMV_GROUP", "lmi_check_gemv_config",
                    "lmi_fused_moe_gemv_kernel", "_lmi_invoke_fused_moe_gemv")


def load_gemv(fused_moe_py: str):
    """Patch 0011's kernel and launcher from a patched fused_moe.py, as a module of their own."""
    return load_definitions(fused_moe_py, GEMV_DEFINITIONS, "moe_gemv")


def gemv_fns(gmod, ctx: ShapeCtx, M: int, gemm: str, config: dict) -> list:
    """One launch of 0011's kernel per weight set (vLLM's naive assignment: an expert id per routed pair), as
    ShapeCtx.fns makes them for vLLM's kernel."""
    top_k = ctx.shape["topk"] if gemm == "w13" else 1
    out = []
    for i in range(ctx.sets_for(M, gemm)):
        inp = ctx.get_inputs(M, i)
        A, As, C, mul = inp.gemm_args(gemm)
        W = ctx.W[gemm]
        ids = inp.topk_ids.reshape(-1)
        out.append(lambda A=A, As=As, C=C, mul=mul, inp=inp, i=i, ids=ids: gmod._lmi_invoke_fused_moe_gemv(
            A, W.B[i], C, As, W.Bs[i], inp.topk_w, ids, mul, top_k, config))
    return out


def relerr(gmod, ctx: ShapeCtx, M: int, gemm: str, config: dict) -> float:
    inp = ctx.get_inputs(M, 0)
    A, As, C, mul = inp.gemm_args(gemm)
    C.fill_(float("nan"))
    if not gemv_fns(gmod, ctx, M, gemm, config)[0]():
        raise RuntimeError("0011's launcher declined the operands (their layout)")
    ref = ctx.ref(M, gemm)
    return ((C.float() - ref).norm() / ref.norm()).item()


def probe(ctx: ShapeCtx, kmod, gmod, M: int, gemm: str, bw: float, space: str) -> dict:
    shipped, source = try_get_config(ctx.shape, M, [str(ROOT / "configs")])
    vllm = run_config(ctx, kmod, M, gemm, shipped)
    tried = []
    for cfg in candidate_configs(space):
        k = (ctx.shape["H"] if gemm == "w13" else ctx.shape["N"])
        if k % cfg["BLOCK_SIZE_K"]:
            continue
        row = {"cfg": cfg}
        try:
            row["relerr"] = relerr(gmod, ctx, M, gemm, cfg)
            if row["relerr"] < TOLERANCE:
                row["us"] = time_graph(gemv_fns(gmod, ctx, M, gemm, cfg))[0]
        except Exception as e:  # noqa: BLE001  (a config Triton cannot build: recorded, the rest go on)
            row["error"] = repr(e)[:200]
        tried.append(row)
    timed = [r for r in tried if "us" in r]
    best = min(timed, key=lambda r: r["us"]) if timed else None
    return {"M": M, "gemm": gemm, "vllm_config": cfg_str(gemm_config(shipped, gemm)), "vllm_source": source,
            "vllm_us": vllm["us"], "vllm_ok": vllm["ok"], "floor_us": 1e6 * ctx.floor_s(M, gemm, bw),
            "gemv_best": best, "gemv_tried": tried,
            "ratio": best["us"] / vllm["us"] if best and vllm["ok"] else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fused-moe-py", required=True, help="vLLM's fused_moe.py with the series applied (0011 included)")
    p.add_argument("--shapes", nargs="+", default=["qwen3-coder-480b-ep8", "qwen3-235b-ep8", "deepseek-v3-ep8"])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--space", choices=["default", "wide"], default="default", help="the candidate configs tried")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("no CUDA device: this probe times kernels on the GPU (the kernel's CPU check is tests/test_moe_decode_gemv.py)")
    dev = torch.device("cuda")
    kmod, sha = load_kernel(a.fused_moe_py, "patched")
    gmod = load_gemv(a.fused_moe_py)
    bw = measure_copy_bandwidth(dev)
    rows = []
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"copy rate {bw / 1e12:.2f} TB/s; vLLM kernel source {sha}")
    print("| shape | M | GEMM | vLLM, shipped config (µs) | candidate best (µs) | its config | candidate/vLLM | floor (µs) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.shapes:
        ctx = ShapeCtx(name, dev)
        for M in a.ms:
            for gemm in ("w13", "w2"):
                r = dict(probe(ctx, kmod, gmod, M, gemm, bw, a.space), shape=name)
                rows.append(r)
                b = r["gemv_best"]
                print(f"| {name} | {M} | {gemm} | {r['vllm_us']:.1f} ({r['vllm_config']}) | "
                      f"{b['us']:.1f} | {b['cfg']} | {r['ratio']:.3f} | {r['floor_us']:.1f} |" if b else
                      f"| {name} | {M} | {gemm} | {r['vllm_us']:.1f} | none passed | - | - | {r['floor_us']:.1f} |",
                      flush=True)
                (a.out / "gemv_probe.json").write_text(json.dumps(
                    {"copy_rate_Bps": bw, "vllm_kernel_sha": sha, "torch": torch.__version__,
                     "triton": __import__("triton").__version__, "rows": rows}, indent=1))
            ctx.drop_m(M)
        del ctx
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
