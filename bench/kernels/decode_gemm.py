"""The decode step's GEMMs outside the fused MoE, on the GPU, each against the other kernels vLLM 0.32 has for it.

    python -m bench.kernels.decode_gemm --out DIR      (the image's Python; --quick: fewer sizes and configs;
                                                      --tokens M ...: the dense layers' token counts)

Run 15's profile of the Qwen3-235B EP8 block shard (docs/performance.md) put 1.35 ms of a 6.5 ms one-client
decode step in the two block-FP8 dense GEMMs of each layer (vLLM's CUTLASS blockwise kernel: 7.2 us each at one
token, 11.2 us at eight) and about 0.55 ms in the router gate (cuBLAS split-K and its reduction, 5.8 us a layer).
This bench times, per shape and token count, the kernels vLLM already ships for each:

- router gate, bf16 x bf16 (hidden K -> experts N): `F.linear` with a bf16 result, as Qwen3-MoE's GateLinear runs
  it (its out_dtype is None); `torch.mm` with a float32 result (GateLinear's cuBLAS tier); the cuteDSL
  `ll_bf16_gemm` (GateLinear's first tier on Hopper, up to 16 tokens, float32 result). Each deployment's full
  router and each shard's local one.
- block-FP8 dense layers (qkv and o_proj of one rank, [128, 128] weight blocks, activations quantized per token
  group of 128): the CUTLASS blockwise kernel (`--linear-backend cutlass`), vLLM's Triton kernel as vLLM runs it
  (`--linear-backend triton`: its config file for the shape if it has one, else its default config), and that
  kernel with the best config of a grid (what a tuned config file would give; picked on one timing per config,
  then timed with the others), patch 0010's split-K variant of it (`lmi_block_fp8_small_m_mm`) with the best of
  its grid, up to 4 tokens patch 0010's matrix-vector kernel (`lmi_block_fp8_gemv`, a small-M file's GEMV entry)
  with the best dict of its grid, and the image's own call (`vllm::lmi_cutlass_block_fp8_mm`: the tier where a
  small-M file in configs/ covers the shape and token count, else CUTLASS). For a layer whose input no fusion
  pass quantizes (o_proj), the input's quantization and CUTLASS against the split-K variant quantizing its bf16
  input itself (a small-M file's fused_input_quant). `python -m bench.kernels.small_m_configs --from
  OUT/decode_gemm.json` turns the cases where the split-K variant beat CUTLASS into small-M files.

Each arm's first call in each case is timed on the wall clock (`first_call_ms`: a JIT compile, such as cuteDSL's
or Triton's for a new config, shows there). Each kernel then runs 100 times in one CUDA graph, the graphs replayed
in turn 7 times (bench/kernels/graph_timing.py): microseconds per call, the median and range of each candidate over
the baseline (F.linear; CUTLASS). The calls of a graph take their weights in turn from copies that together hold
three times L2 (`weight_sets`), so that each call reads them from HBM, as a decode step reads each layer's. Every
output is compared with a float32 reference. Prints markdown tables, writes decode_gemm.json and decode_gemm.md.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch

from bench.kernels.graph_timing import CALLS, REPS, graph_of, in_turn, time_us
from bench.kernels.moe.problem import ROTATED_BYTES, n_sets_for
from serving.paths import CONFIGS_DIR

BLOCK = 128
# The checkpoints' full routers (hidden, experts): what each deployment runs on every rank.
ROUTERS = {"qwen3-235b-a22b": (4096, 128), "qwen3-coder-480b-a35b": (6144, 160), "deepseek-v3": (7168, 256)}
# The engine bench's block-FP8 shards (bench/e2e/shards.py presets), whose dense layers and local routers these are.
SHARD_PRESETS = ("qwen3-235b-a22b-ep8", "qwen3-coder-480b-a35b-ep8", "deepseek-v3-ep8", "qwen3-235b-a22b-tp4",
                 "qwen3-coder-480b-a35b-tp4", "deepseek-v3-tp8", "deepseek-v3-tp8-mla")
ROUTER_TOKENS = (1, 2, 4, 8, 16, 32)
DENSE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
LL_BF16_MAX_TOKENS = 16  # GateLinear.LL_BF16_MAX_TOKENS in vLLM 0.32
# vLLM's Triton block-FP8 kernel needs BLOCK_SIZE_K == the weight block's K (its scales are read per K block).
TRITON_GRID = [dict(BLOCK_SIZE_M=m, BLOCK_SIZE_N=n, BLOCK_SIZE_K=BLOCK, GROUP_SIZE_M=1, num_warps=w, num_stages=s)
               for m, n, w, s in itertools.product((16, 32, 64), (32, 64, 128), (4, 8), (3, 4, 5))]
QUICK_GRID = [c for c in TRITON_GRID if c["BLOCK_SIZE_M"] == 16 and c["num_stages"] == 4]
# Patch 0010's split-K kernel: the tiles kernel probe 16b found best at 1 and 8 tokens.
SPLIT_GRID = [dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=n, BLOCK_SIZE_K=BLOCK, SPLIT_K=s, num_warps=4, num_stages=st)
              for n, s, st in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (3, 4))]
QUICK_SPLIT_GRID = [c for c in SPLIT_GRID if c["num_stages"] == 3 and c["BLOCK_SIZE_N"] in (32, 64, 128)]
# Above TALL_TILE_TOKENS (a decode step of 33-128 requests, where CUTLASS takes about its 32-token time) the split-K
# kernel's grid takes taller tiles as well, 8 warps for the tallest: either grid, quick or not, then gives way to it.
TALL_TILE_TOKENS = 32
TALL_SPLIT_GRID = [dict(BLOCK_SIZE_M=m, BLOCK_SIZE_N=n, BLOCK_SIZE_K=BLOCK, SPLIT_K=s, num_warps=w, num_stages=3)
                   for m, n, s, w in itertools.product((16, 32, 64), (32, 64, 128), (1, 2, 4, 8), (4, 8))
                   if w == 4 or m == 64]
# Patch 0010's GEMV entries (the matrix-vector kernel) for decode batches of up to GEMV_MAX_TOKENS: the dicts around
# kernel probe 24b's best (4-8 rows a program, K steps of 512-4,096), those that tile the shape
GEMV_GRID = [dict(BLOCK_SIZE_N=n, BLOCK_SIZE_K=k, num_warps=4, num_stages=st)
             for n, k, st in itertools.product((4, 8, 16), (512, 2048, 4096), (2, 3))]
QUICK_GEMV_GRID = [c for c in GEMV_GRID if c["num_stages"] == 3 and c["BLOCK_SIZE_N"] in (4, 8)]
GEMV_MAX_TOKENS = 4
FUSED = "split-K quantizing"  # the arm of patch 0010's fused_input_quant: the split-K kernel on the bf16 input


def gemv_tiles(gemv: dict, N: int, K: int) -> bool:
    """Whether a GEMV dict tiles (N, K) as patch 0010's lmi_check_gemv_entry requires of [128, 128] blocks:
    BLOCK_SIZE_N a power of two dividing 128 and N, BLOCK_SIZE_K a power of two of whole groups dividing K."""
    bn, bk = gemv["BLOCK_SIZE_N"], gemv["BLOCK_SIZE_K"]
    return not (bn & (bn - 1) or BLOCK % bn or N % bn or bk & (bk - 1) or bk % BLOCK or K % bk)


def weight_sets(*tensors: torch.Tensor, total: int = ROTATED_BYTES) -> list[tuple[torch.Tensor, ...]]:
    """The tensors and enough copies of them (same values, other memory) that all the sets together hold at least
    `total` bytes, by the kernel harness's rule (n_sets_for: two sets at least, and no more than a graph's CALLS
    calls take); the first set is the tensors themselves. By default the harness's rotation, three times L2, so that
    each call reads its weights from HBM (as a decode step reads every layer's once), not from L2."""
    size = sum(t.numel() * t.element_size() for t in tensors)
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(n_sets_for(size, size, CALLS, total) - 1)]


def rotating(call, sets: list[tuple[torch.Tensor, ...]]):
    """A zero-argument call of `call(*set)`, each call with the next set: the first call (the reference check) the
    first set, the calls a CUDA graph captures one set after another."""
    turn = itertools.cycle(sets)
    return lambda: call(*next(turn))


def shard_shapes(presets=SHARD_PRESETS) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """Each shard's dense GEMMs, (N, K), one entry per distinct shape: qkv (q, k and v heads -> hidden) and o_proj
    (hidden <- q heads), and its local router (hidden, local experts). DeepSeek-V3's own architecture instead: MLA's
    q_b (the query's rank -> q heads of a no-RoPE and a RoPE part) and o_proj (hidden <- value heads), and the shared
    expert's gate_up. Left out: MLA's fused q_a and kv_a projection (2,112 wide, no multiple of the 128 block), the
    shared expert's down (K=256: 1.8 MB, shorter than any GEMV step) and the three dense first layers' MLP."""
    from bench.e2e.shards import preset_spec

    dense, routers = {}, {}
    for preset in presets:
        s = preset_spec(preset)
        if s.arch == "deepseek_v3":
            shared = s.shared_experts * s.moe_intermediate
            dense.setdefault((s.heads * (s.head_dim + s.rope_head_dim), s.q_lora_rank), f"{preset} q_b_proj")
            dense.setdefault((s.hidden, s.heads * s.v_head_dim), f"{preset} o_proj")
            dense.setdefault((2 * shared, s.hidden), f"{preset} shared gate_up")
            continue
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        dense.setdefault((q + 2 * kv, s.hidden), f"{preset} qkv")
        dense.setdefault((s.hidden, q), f"{preset} o_proj")
        if (s.hidden, s.experts) not in ROUTERS.values():  # a TP rank's router is the checkpoint's full one
            routers.setdefault((s.hidden, s.experts), f"{preset} local router")
    return {v: k for k, v in dense.items()}, {v: k for k, v in routers.items()}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# A line of a compiler's output that says what went wrong (nvcc, g++ and CCCL word them so).
_ERROR_LINE = re.compile(r"\berror\b|\bfatal\b|#error", re.IGNORECASE)
ERROR_LINES = 10


def failure(e: BaseException, head: int = 300, tail: int = 600) -> str:
    """An arm's error as recorded: its start (the command a JIT ran), the lines between that name an error (the
    compiler's own words, which DeepGEMM's JIT puts before a long C++ stack trace), and its end."""
    text = repr(e)
    if len(text) <= head + tail:
        return text
    middle = text[head:-tail].replace("\\n", "\n").splitlines()
    errors = [ln.strip()[:300] for ln in middle if _ERROR_LINE.search(ln)][:ERROR_LINES]
    return " [...] ".join([text[:head], *errors, text[-tail:]])


def working(arms: dict, ref: torch.Tensor, failed: dict, first_ms: dict) -> dict:
    """The arms that run (each one's relative error against ref); an arm that raises is left out, its error in
    `failed`. first_ms: each arm's first call here, in ms of wall time (a JIT compile shows as a long one)."""
    errors = {}
    for name, fn in list(arms.items()):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            y = fn()
            torch.cuda.synchronize()
            first_ms[name] = round(1e3 * (time.perf_counter() - t0), 2)
            errors[name] = relative_error(y, ref)
        except Exception as e:  # a kernel that does not take this shape: recorded, not timed
            failed[name] = failure(e)
            del arms[name]
    return errors


def timed(arms: dict, baseline: str, pairs: tuple[tuple[str, str], ...] = ()) -> tuple[dict, dict]:
    """Each arm's median us per call, and each other arm's paired ratio to the baseline [median, min, max]; for each
    (arm, other) of `pairs` that both ran, also arm's paired ratio to other, under "arm/other"."""
    if baseline not in arms:
        return {}, {}
    t = in_turn({a: graph_of(f) for a, f in arms.items()})
    ratios = {a: [c / b for b, c in zip(t[baseline], t[a])] for a in arms if a != baseline}
    ratios.update({f"{a}/{o}": [x / y for x, y in zip(t[a], t[o])] for a, o in pairs if a in t and o in t})
    return ({a: statistics.median(v) for a, v in t.items()},
            {a: [statistics.median(r), min(r), max(r)] for a, r in ratios.items()})


def measured(arms: dict, ref: torch.Tensor, baseline: str, failed: dict | None = None,
             pairs: tuple[tuple[str, str], ...] = ()) -> dict:
    """One case: its arms run once against ref (working), then in CUDA graphs against the baseline (timed); its
    record (errors, failed: `failed` and the arms that raised, us, ratio, first_call_ms)."""
    failed, first_ms = dict(failed or {}), {}
    errors = working(arms, ref, failed, first_ms)
    us, ratio = timed(arms, baseline, pairs)
    return {"errors": errors, "failed": failed, "us": us, "ratio": ratio, "first_call_ms": first_ms}


def cell(us: dict, ratio: dict, arm: str) -> str:
    return f"{us[arm]:.2f} ({ratio[arm][0]:.3f})" if arm in us else "-"


def router_cases(tokens, presets, out: dict, rows: list[str]) -> None:
    from vllm.model_executor.kernels.linear.cute_dsl import ll_bf16

    ll_ok = ll_bf16.is_available()
    _, local = shard_shapes(presets)
    full = {name: shape for name, shape in ROUTERS.items() if any(p.startswith(name) for p in presets)}
    for name, (k, n) in {**full, **local}.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        sets = weight_sets(w)
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ w.float().T
            arms = {"F.linear bf16": rotating(lambda w, x=x: torch.nn.functional.linear(x, w), sets),
                    "mm fp32": rotating(lambda w, x=x: torch.mm(x, w.T, out_dtype=torch.float32), sets)}
            if ll_ok and m <= LL_BF16_MAX_TOKENS and k % 8 == 0:
                arms["ll_bf16_gemm"] = rotating(lambda w, x=x: ll_bf16.ll_bf16_gemm(x, w), sets)
            case = out[f"router {name} M={m}"] = {"k": k, "n": n, "m": m, **measured(arms, ref, "F.linear bf16")}
            us, ratio, errors = case["us"], case["ratio"], case["errors"]
            if not us:
                rows.append(f"| {name} | {k} x {n} | {m} | failed: {case['failed']} | | | |")
                continue
            rows.append(f"| {name} | {k} x {n} | {m} | {us['F.linear bf16']:.2f} | {cell(us, ratio, 'mm fp32')} | "
                        f"{cell(us, ratio, 'll_bf16_gemm')} | {max(errors.values()):.1e} |")
    if not ll_ok:
        rows.append("\nll_bf16_gemm: not available here (cuteDSL, the nvidia-cutlass-dsl packages, not importable)")


@contextlib.contextmanager
def triton_config(fp8_utils, config: dict | None):
    """vLLM's Triton block-FP8 kernel with `config` for every M (None: as vLLM runs it, its file or default)."""
    if config is None:
        yield
        return
    saved = fp8_utils.get_w8a8_block_fp8_configs
    fp8_utils.get_w8a8_block_fp8_configs = lambda *a, **k: {1: config}
    try:
        yield
    finally:
        fp8_utils.get_w8a8_block_fp8_configs = saved


def best_of(grid: list[dict], make) -> dict | None:
    """The config of `grid` whose call, make(config), is fastest in a CUDA graph (one timing each); None if none runs."""
    sweep = {}
    for i, config in enumerate(grid):
        try:
            sweep[i] = time_us(graph_of(make(config)))
        except Exception:  # a config the kernel cannot run (shared memory): not a candidate
            continue
    return grid[min(sweep, key=sweep.get)] if sweep else None


def block_fp8_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random block-FP8 weight of N x K on the GPU: its FP8 values, its float32 scales a 128 x 128 block, and the
    float32 weight they stand for (the reference's)."""
    w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    ws = torch.rand(n // BLOCK, k // BLOCK, device="cuda") * 1e-2 + 1e-3
    return w, ws, w.float() * ws.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)


def split_grid_for(m: int, grid: list[dict]) -> list[dict]:
    """The split-K configs to try at m tokens: `grid` up to TALL_TILE_TOKENS, the grid with taller tiles above."""
    return grid if m <= TALL_TILE_TOKENS else TALL_SPLIT_GRID


def split_label(config: dict) -> str:
    """A split-K config in the table: its tile's N, its K split and stages; a tile taller than 16 rows, and warps
    other than 4, named in front."""
    tall = "" if config["BLOCK_SIZE_M"] == 16 else f"M{config['BLOCK_SIZE_M']} "
    warps = "" if config["num_warps"] == 4 else f"w{config['num_warps']} "
    return f"{tall}{warps}N{config['BLOCK_SIZE_N']} K/{config['SPLIT_K']} s{config['num_stages']}"


def dense_cases(tokens, presets, grid, split_grid, out: dict, rows: list[str], gemv_grid=()) -> None:
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import cutlass_scaled_mm
    from vllm.model_executor.layers.quantization.utils import fp8_utils

    image_op = torch.ops.vllm.lmi_cutlass_block_fp8_mm  # registered by the patched cutlass module imported above
    dense, _ = shard_shapes(presets)
    for name, (n, k) in dense.items():
        w, ws, w_ref = block_fp8_weight(n, k)
        sets = weight_sets(w, ws)
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            # each kernel's activation layout as vLLM's linear method quantizes it: column-major scales for CUTLASS
            xq_c, xs_c = fp8_utils.per_token_group_quant_fp8(x, BLOCK, column_major_scales=True)
            xq_t, xs_t = fp8_utils.per_token_group_quant_fp8(x, BLOCK)
            ref = (xq_t.float() * xs_t.repeat_interleave(BLOCK, 1)) @ w_ref.T

            # each arm a call of one weight set (w, ws), made a zero-argument call over the rotated sets
            def cutlass(w, ws):
                return cutlass_scaled_mm(xq_c, w, xs_c, ws, [BLOCK, BLOCK], torch.bfloat16)

            def triton_with(config):
                def run(w, ws):
                    with triton_config(fp8_utils, config):
                        return fp8_utils.w8a8_triton_block_scaled_mm(xq_t, w, xs_t, ws, [BLOCK, BLOCK],
                                                                     torch.bfloat16)
                return rotating(run, sets)

            def split_k_with(config):
                return rotating(lambda w, ws: fp8_utils.lmi_block_fp8_small_m_mm(
                    xq_t, w, xs_t, ws, [BLOCK, BLOCK], config, torch.bfloat16), sets)

            def gemv_with(config):
                return rotating(lambda w, ws: fp8_utils.lmi_block_fp8_gemv(
                    xq_t, w, xs_t, ws, [BLOCK, BLOCK], config, torch.bfloat16), sets)

            def image(w, ws):
                return image_op(xq_c, w, xs_c, ws, [BLOCK, BLOCK], torch.bfloat16)

            def quant_then_cutlass(w, ws):  # a layer whose input no fusion pass quantizes (o_proj): two kernels
                xq, xs = fp8_utils.per_token_group_quant_fp8(x, BLOCK, column_major_scales=True, use_ue8m0=False)
                return cutlass_scaled_mm(xq, w, xs, ws, [BLOCK, BLOCK], torch.bfloat16)

            def split_k_quantizing(config):  # patch 0010's fused_input_quant: the bf16 input, one kernel
                return rotating(lambda w, ws: fp8_utils.lmi_block_fp8_small_m_mm(
                    x, w, None, ws, [BLOCK, BLOCK], config, torch.bfloat16), sets)

            best = best_of(grid, triton_with)
            best_split = best_of(split_grid_for(m, split_grid), split_k_with)
            best_gemv = best_of([c for c in gemv_grid if gemv_tiles(c, n, k)], gemv_with) \
                if m <= GEMV_MAX_TOKENS else None
            arms = {"cutlass": rotating(cutlass, sets), "image": rotating(image, sets), "triton": triton_with(None)}
            image_config = fp8_utils.lmi_small_m_config(m, n, k, [BLOCK, BLOCK])
            if best is not None:
                arms["triton tuned"] = triton_with(best)
            if best_split is not None:
                arms["triton split-K"] = split_k_with(best_split)
                arms["quant + cutlass"] = rotating(quant_then_cutlass, sets)
                arms[FUSED] = split_k_quantizing(best_split)
            if best_gemv is not None:
                arms["GEMV"] = gemv_with(best_gemv)
            case = out[f"dense {name} M={m}"] = {
                "n": n, "k": k, "m": m, **measured(arms, ref, "cutlass", pairs=((FUSED, "quant + cutlass"),)),
                "best_config": best, "best_split_k_config": best_split, "best_gemv_config": best_gemv,
                "image_config": image_config}
            us, ratio, errors = case["us"], case["ratio"], case["errors"]
            if not us:
                rows.append(f"| {name} | {n} x {k} | {m} | failed: {case['failed']} | | | | | | | | | | | |")
                continue
            tiles = (f"{best['BLOCK_SIZE_M']}x{best['BLOCK_SIZE_N']} w{best['num_warps']} s{best['num_stages']}"
                     if best else "-")
            split = split_label(best_split) if best_split else "-"
            tier = "CUTLASS" if not image_config else "GEMV tier" if "GEMV" in image_config else "split-K tier"
            gemv = f"N{best_gemv['BLOCK_SIZE_N']} K{best_gemv['BLOCK_SIZE_K']} s{best_gemv['num_stages']}" \
                if best_gemv else "-"
            rows.append(f"| {name} | {n} x {k} | {m} | {us['cutlass']:.2f} | {cell(us, ratio, 'image')} {tier} | "
                        f"{cell(us, ratio, 'triton')} | "
                        f"{cell(us, ratio, 'triton tuned')} | {tiles} | {cell(us, ratio, 'triton split-K')} | "
                        f"{split} | {cell(us, ratio, 'quant + cutlass')} | "
                        f"{cell(us, ratio, FUSED)} | {cell(us, ratio, 'GEMV')} | {gemv} | {max(errors.values()):.1e} |")


def finish(out: Path, stem: str, results: dict, tables: str) -> int:
    """OUT/<stem>.json and <stem>.md (the tables and the largest relative error), printed too; the exit status: 0
    where every case timed its baseline and no output was 5% off (bf16 outputs of float32 sums: about 1e-2 at most)."""
    worst = max((e for c in results["cases"].values() for e in c["errors"].values()), default=float("inf"))
    results["max_relative_error"] = worst
    text = tables + f"\n\nlargest relative error: {worst:.1e}\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (out / f"{stem}.md").write_text(text)
    print(text)
    return 0 if worst < 0.05 and all(c["us"] for c in results["cases"].values()) else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true", help="1, 8 and 32 tokens and a 6-config grid")
    p.add_argument("--tokens", type=int, nargs="+", metavar="M",
                   help="the dense layers' token counts to time (default: 1, 8 and 32 with --quick, else "
                        f"{', '.join(map(str, DENSE_TOKENS))}); above {TALL_TILE_TOKENS} the split-K kernel also "
                        "tries taller tiles")
    p.add_argument("--presets", nargs="+", choices=SHARD_PRESETS, default=SHARD_PRESETS,
                   help="the shards whose dense layers and routers to time (default: all)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.tokens and min(a.tokens) < 1:
        p.error(f"--tokens: token counts are 1 or more, not {min(a.tokens)}")
    return a


def main() -> int:
    a = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_gemm_bench: no CUDA device here; it times GPU kernels")
    # the image's call reads the small-M files where the launcher points vLLM: configs/
    os.environ.setdefault("VLLM_TUNED_CONFIG_FOLDER", str(CONFIGS_DIR))
    torch.manual_seed(0)
    router_tokens = (1, 8, 16) if a.quick else ROUTER_TOKENS
    dense_tokens = a.tokens or ((1, 8, 32) if a.quick else DENSE_TOKENS)
    grid = QUICK_GRID if a.quick else TRITON_GRID
    import triton

    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "calls_per_graph": CALLS,
               "reps": REPS, "cases": {}}
    router_rows = ["| router | hidden x experts | tokens | F.linear bf16 us | mm fp32 us (/F.linear) | "
                   "ll_bf16_gemm us (/F.linear) | max rel. error |", "|---|---|---|---|---|---|---|"]
    dense_rows = ["| layer | N x K | tokens | CUTLASS us | the image's call us (/CUTLASS) | Triton as vLLM runs it us "
                  "(/CUTLASS) | Triton tuned us (/CUTLASS) | tuned config | Triton split-K us (/CUTLASS) | "
                  "split-K config | quantize + CUTLASS us (/CUTLASS) | split-K quantizing its bf16 input us "
                  "(/CUTLASS) | GEMV us (/CUTLASS) | GEMV config | max rel. error |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    router_cases(router_tokens, a.presets, results["cases"], router_rows)
    dense_cases(dense_tokens, a.presets, grid, QUICK_SPLIT_GRID if a.quick else SPLIT_GRID, results["cases"],
                dense_rows, QUICK_GEMV_GRID if a.quick else GEMV_GRID)
    return finish(a.out, "decode_gemm", results, "\n".join(router_rows) + "\n\n" + "\n".join(dense_rows))


if __name__ == "__main__":
    raise SystemExit(main())
