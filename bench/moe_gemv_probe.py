"""H200 probe: patch 0011's decode fused-MoE kernel (matrix-vector products) against vLLM's fused_moe_kernel with the
shipped config, side by side in one process, for the block-FP8 EP8 ranks at 1-4 tokens.

    python3 bench/moe_gemv_probe.py --fused-moe-py PATCHED/fused_moe.py --out DIR \
        [--shapes qwen3-coder-480b-ep8 qwen3-235b-ep8 deepseek-v3-ep8] [--ms 1 2 4] [--expert-map] [--silu]

Runs on the GPU host's own torch and Triton (no wheelhouse). Both kernels are cut out of the given fused_moe.py
(the series applied) as the kernel harness does (bench/moe/): vLLM's with the entry `configs/` holds for the shape
and token count, 0011's launcher with each config of bench/moe/gemv_space.py, checked against the harness's float32
reference before it is timed. Times are per launch, from CUDA graphs of launches over rotating weight sets larger than L2 (the harness's
time_graph). Writes DIR/gemv_probe.json and prints a table: vLLM's time, the candidate's best and its config, their
ratio, and the memory floor at the measured copy rate. --expert-map times the best configs on an EP rank's batches
too; --silu times patch 0012's w2 kernel (the w13 output in, SiLU-and-mul and quantization inside) against 0011's.
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
from bench.moe.problem import Inputs, ShapeCtx, dequant_a, dequant_w  # noqa: E402
from bench.moe.timing import measure_copy_bandwidth, run_config, time_graph  # noqa: E402
from bench.norm_quant_probe import group_quant  # noqa: E402

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
TOLERANCE = 5e-2  # the harness's (bench/moe/problem.check): fp8 products summed over K=2,560-7,168


# Patch 0011's definitions the probe runs (its launcher checks the config and launches the kernel)
GEMV_DEFINITIONS = ("LMI_MOE_DECODE_GEMV_ENV", "_LMI_GEMV_GROUP", "lmi_check_gemv_config",
                    "lmi_fused_moe_gemv_kernel", "_lmi_invoke_fused_moe_gemv")


# Patch 0012's: the w2 GEMV taking the w13 output, SiLU-and-mul and the FP8 group quantization in the kernel
SILU_DEFINITIONS = ("lmi_fused_moe_gemv_silu_kernel", "lmi_invoke_fused_moe_gemv_silu")


def load_gemv(fused_moe_py: str):
    """Patch 0011's kernel and launcher from a patched fused_moe.py, as a module of their own."""
    return load_definitions(fused_moe_py, GEMV_DEFINITIONS + SILU_DEFINITIONS, "moe_gemv")


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


class MappedBatch:
    """One decode batch as a rank of the real EP deployment sees it: M tokens, each routed to the deployment's top-k
    of its global experts (shape["ep"]), this rank holding global experts 0..E-1; the ids mapped as an expert map
    would map them (another rank's expert: -1). The operands are the harness's Inputs over the global routing."""

    def __init__(self, shape: dict, M: int, dev, gen):
        experts, top_k = shape["ep"]
        self.top_k = top_k
        self.inp = Inputs(dict(shape, E=experts, topk=top_k), M, dev, gen)
        flat = self.inp.topk_ids.reshape(-1)
        self.ids = torch.where(flat < shape["E"], flat, torch.full_like(flat, -1)).contiguous()
        self.local_pairs = int((self.ids >= 0).sum())
        self.topk_w = self.inp.topk_w

    def args(self, gemm: str):
        """(A, A_scale, C, mul_routed_weight, top_k) of one GEMM."""
        return (*self.inp.gemm_args(gemm), self.top_k if gemm == "w13" else 1)

    def launch(self, gmod, B, Bs, gemm: str, config: dict, pairs_per_program: int = 1) -> bool:
        A, As, C, mul, top_k = self.args(gemm)
        return gmod._lmi_invoke_fused_moe_gemv(A, B, C, As, Bs, self.topk_w, self.ids, mul, top_k, config,
                                               pairs_per_program)

    def reference(self, shape: dict, B, Bs, gemm: str):
        """float32 result of every pair (zeros for another rank's expert's)."""
        A, As, C, mul, top_k = self.args(gemm)
        a = dequant_a(A, As, shape["block"])
        w = dequant_w(B, Bs, shape["block"])
        out = torch.zeros((self.ids.numel(), w.shape[1]), device=A.device, dtype=torch.float32)
        for p, e in enumerate(self.ids.tolist()):
            if e >= 0:
                out[p] = a[p // top_k] @ w[e].t() * (self.topk_w.reshape(-1)[p] if mul else 1.0)
        return out.view(C.shape)


def probe_mapped(ctx: ShapeCtx, gmod, M: int, gemm: str, config: dict, sets: int = 8) -> list[dict]:
    """0011's launcher with this config on the same `sets` mapped batches (a routing each, over the harness's weight
    sets) with each grid: a program per routed pair, and a program per token taking its top-k pairs in turn (vLLM's
    launch under an expert map); a pair of another rank's expert writes zeros. Per grid its relative error on the
    first batch and its time per launch over all."""
    W = ctx.W[gemm]
    batches = [MappedBatch(ctx.shape, M, ctx.dev, ctx.gen) for _ in range(sets)]
    b0, n, out = batches[0], len(W.B), []
    ref = b0.reference(ctx.shape, W.B[0], W.Bs[0], gemm)
    for per_program in (1, ctx.shape["ep"][1]):
        b0.args(gemm)[2].fill_(float("nan"))
        if not b0.launch(gmod, W.B[0], W.Bs[0], gemm, config, per_program):
            raise RuntimeError("0011's launcher declined the mapped operands (their layout)")
        got = b0.args(gemm)[2].float()
        err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        fns = [lambda b=b, i=i: b.launch(gmod, W.B[i % n], W.Bs[i % n], gemm, config, per_program)
               for i, b in enumerate(batches)]
        out.append({"relerr": err, "us": time_graph(fns)[0] if err < TOLERANCE else None,
                    "pairs": M * ctx.shape["ep"][1], "pairs_per_program": per_program,
                    "local_pairs": [b.local_pairs for b in batches]})
    return out


def silu_unfused(X: torch.Tensor, K: int, ue8m0: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The w2 input as vLLM makes it from the w13 output X (gate, then up): act_and_mul (SiLU in float32, rounded to
    X's dtype, times up, rounded again), then per_token_group_quant_fp8's formula, UE8M0 scales as DeepGEMM's E8M0
    asks on Hopper: (FP8 values, float32 scales)."""
    act = (torch.nn.functional.silu(X[:, :K].float()).to(X.dtype).float() * X[:, K:].float()).to(X.dtype)
    return group_quant(act, ue8m0)


def probe_silu(ctx: ShapeCtx, gmod, M: int, plain: dict, space: str) -> dict:
    """Patch 0012's w2 GEMV on the w13 output (SiLU-and-mul and the group quantization in the kernel) with each
    candidate config, against 0011's w2 GEMV on the quantized input with its best config (`plain`, timed on the
    same weight sets). Each config is checked first against 0011's kernel on the unfused path's values."""
    W, K = ctx.W["w2"], ctx.shape["N"]
    n = ctx.sets_for(M, "w2")
    inps = [ctx.get_inputs(M, i) for i in range(n)]
    pairs = M * ctx.shape["topk"]
    gen = torch.Generator(device=ctx.dev).manual_seed(99)
    X = [(torch.randn(pairs, 2 * K, device=ctx.dev, generator=gen) * 2).to(torch.bfloat16) for _ in range(n)]
    ids = [inp.topk_ids.reshape(-1).contiguous() for inp in inps]
    q, s = silu_unfused(X[0], K)
    C = inps[0].gemm_args("w2")[2]
    C.fill_(float("nan"))
    gmod._lmi_invoke_fused_moe_gemv(q, W.B[0], C, s, W.Bs[0], inps[0].topk_w, ids[0], True, 1, plain["cfg"])
    ref = C.float().clone()
    tried = []
    for cfg in candidate_configs(space):
        if K % cfg["BLOCK_SIZE_K"]:
            continue
        row = {"cfg": cfg}
        try:
            C.fill_(float("nan"))
            if not gmod.lmi_invoke_fused_moe_gemv_silu(X[0], W.B[0], C, W.Bs[0], inps[0].topk_w, ids[0], True,
                                                       cfg, True, FP8_MAX):
                raise RuntimeError("0012's launcher declined the operands (their layout)")
            row["relerr"] = ((C.float() - ref).norm() / ref.norm()).item()
            if row["relerr"] < TOLERANCE:
                fns = [lambda i=i: gmod.lmi_invoke_fused_moe_gemv_silu(
                    X[i], W.B[i], inps[i].gemm_args("w2")[2], W.Bs[i], inps[i].topk_w, ids[i], True, cfg, True,
                    FP8_MAX) for i in range(n)]
                row["us"] = time_graph(fns)[0]
        except Exception as e:  # noqa: BLE001  (a config Triton cannot build: recorded, the rest go on)
            row["error"] = repr(e)[:200]
        tried.append(row)
    timed = [r for r in tried if "us" in r]
    best = min(timed, key=lambda r: r["us"]) if timed else None
    same = next((r for r in timed if r["cfg"] == plain["cfg"]), None)
    return {"plain_us": plain["us"], "plain_cfg": plain["cfg"], "best": best, "same_cfg": same, "tried": tried,
            "ratio": best["us"] / plain["us"] if best else None}


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
    p.add_argument("--expert-map", action="store_true",
                   help="also time each best config as a rank of the real EP deployment would run it: the "
                        "deployment's global top-k per token, ids mapped (another rank's expert: -1), against "
                        "the same vLLM figure (vLLM's aligned path under an expert map adds its alignment kernel)")
    p.add_argument("--silu", action="store_true",
                   help="also time patch 0012's w2 GEMV on the w13 output (SiLU-and-mul and the FP8 group "
                        "quantization in the kernel) against 0011's best w2 GEMV; the two kernels 0012 removes "
                        "(act_and_mul, per_token_group_quant) are vLLM's CUDA ops, not timed here")
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
                if a.silu and b and gemm == "w2":
                    r["silu"] = f = probe_silu(ctx, gmod, M, b, a.space)
                    fb = f["best"]
                    print(f"| {name}, w2 GEMV with SiLU and quantization (0012) | {M} | w2 | {b['us']:.1f} (0011) | "
                          + (f"{fb['us']:.1f} | {fb['cfg']} | {f['ratio']:.3f} of 0011's; error {fb['relerr']:.4f} "
                             "| - |" if fb else "none passed | - | - | - |"), flush=True)
                if a.expert_map and b:
                    r["mapped_runs"] = probe_mapped(ctx, gmod, M, gemm, b["cfg"])
                for m in r.get("mapped_runs", ()):
                    mu = m["us"]
                    print(f"| {name}, mapped ids ({m['pairs']} pairs a launch, {m['pairs_per_program']} a program) "
                          f"| {M} | {gemm} | {r['vllm_us']:.1f} | {mu if mu is None else round(mu, 1)} | error "
                          f"{m['relerr']:.4f} | {mu / r['vllm_us'] if mu else float('nan'):.3f} | - |", flush=True)
                (a.out / "gemv_probe.json").write_text(json.dumps(
                    {"copy_rate_Bps": bw, "vllm_kernel_sha": sha, "torch": torch.__version__,
                     "triton": __import__("triton").__version__, "rows": rows}, indent=1))
            ctx.drop_m(M)
        del ctx
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
