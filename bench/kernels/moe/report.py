"""Markdown tables for docs/performance.md from the harness's JSON output
(bench_*.json, jit_*.json). CUPTI kernel times where recorded, else the
CUDA-graph per-launch time."""
from __future__ import annotations

import argparse
import json

from serving.paths import CONFIGS_DIR
from serving.vllm_patches.moe_configs import config_file_name, get_moe_configs, nearest_config

from .configs import entry_str
from .shapes import SHAPES, TP8_SHAPES, gemm_dims


FP8_PEAK = 1.3e15  # FLOP/s: torch._scaled_mm 8192^3 measured once on the H200, not per run


def compute_floor_us(sh, M, gemm):
    nout, k = gemm_dims(sh, gemm)
    return 2.0 * M * sh["topk"] * nout * k / FP8_PEAK * 1e6


def t_of(r):
    t = r.get("cupti_us")
    return r["us"] if t is None or t != t else t


def bench_tables(path, configs_dir, shapes=None):
    """Per shape and M: stock vLLM (stock kernel source, its file or default)
    vs the benched files ("ours", patched source); 'shipped' = the entry in
    configs_dir: ours where it equals the benched one, else stock."""
    d = json.load(open(path))
    by = {}
    for r in d["rows"]:
        if shapes is not None and r["shape"] not in shapes:
            continue
        by.setdefault(r["shape"], {}).setdefault(r["M"], {}).setdefault(r["variant"], {})[r["gemm"]] = r
    out = [f"Copy bandwidth measured in this run: {d['bw'] / 1e12:.2f} TB/s (read + write). Times are CUPTI "
           "kernel durations in µs (median of the launches of 3 graph replays, min of 2 interleaved rounds). "
           "`mem floor` = (fp8 bytes of the experts the routed tokens touch + fp8 activations + bf16 outputs) / "
           "copy bandwidth; `frac` = mem floor / time (the goal's measure); `roofline frac` = max(mem floor, "
           "FLOPs / 1300 TFLOP/s fp8) / time, which matters from M ~ 1024 on, where the GEMMs turn compute-bound. "
           "Entries: `w13 <config> / w2 <config>` for a per-GEMM entry (patch 0003), `k4` = SPLIT_K 4 (patch "
           "0004), `x0` = swap-AB forced off. 'shipped' = the entry in `configs/`: the benched one where the "
           "re-run kept it, else stock.\n"]
    summary = {}
    for shape, per_m in by.items():
        sh = SHAPES[shape]
        fname = config_file_name(sh["E"], sh["N"], sh["block"])
        shipped_cfgs, _ = get_moe_configs(sh["E"], sh["N"], sh["block"], [configs_dir])
        out.append(f"\n#### {shape}: E={sh['E']}, top-{sh['topk']}, hidden {sh['H']}, N={sh['N']}"
                   f"{', block ' + str(sh['block']) if sh['block'] else ''} (file `{fname}`)\n")
        out.append("| M | stock config (source) | stock w13 / w2 = sum | benched entry | benched w13 / w2 = sum | "
                   "benched/stock | shipped | mem floor w13 / w2 | frac w13 / w2 (shipped) | "
                   "roofline frac w13 / w2 (shipped) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for M in sorted(per_m):
            v = per_m[M]
            st, ours = v["stock"], v.get("ours")
            s13, s2 = t_of(st["w13"]), t_of(st["w2"])
            f13, f2 = st["w13"]["floor_us"], st["w2"]["floor_us"]
            r13, r2 = max(f13, compute_floor_us(sh, M, "w13")), max(f2, compute_floor_us(sh, M, "w2"))
            ship13, ship2, shipped = s13, s2, "stock"
            o_entry = o_s = ratio_s = ""
            if ours:
                o13, o2 = t_of(ours["w13"]), t_of(ours["w2"])
                o_entry = ours["w13"].get("entry", ours["w13"]["cfg"])
                o_s = f"{o13:.1f} / {o2:.1f} = {o13 + o2:.1f}"
                ratio_s = f"{(o13 + o2) / (s13 + s2):.3f}"
                if shipped_cfgs:
                    _, shipped_entry = nearest_config(shipped_cfgs, M)
                    if entry_str(shipped_entry) == o_entry and o_entry != st["w13"]["cfg"]:
                        ship13, ship2, shipped = o13, o2, "benched"
                o_entry = "= stock" if o_entry == st["w13"]["cfg"] else f"`{o_entry}`"
            src = st["w13"]["src"].replace("file:configs", "stock file")
            out.append(f"| {M} | `{st['w13']['cfg']}` ({src}) | {s13:.1f} / {s2:.1f} = {s13 + s2:.1f} | {o_entry} | "
                       f"{o_s} | {ratio_s} | {shipped} | {f13:.1f} / {f2:.1f} | {f13 / ship13:.2f} / {f2 / ship2:.2f} | "
                       f"{r13 / ship13:.2f} / {r2 / ship2:.2f} |")
            summary.setdefault(shape, {})[M] = {"rfrac13": r13 / ship13, "rfrac2": r2 / ship2, "stock": s13 + s2,
                                                "ship": ship13 + ship2, "frac13": f13 / ship13, "frac2": f2 / ship2}
    return "\n".join(out), summary


def goals(summary, shapes):
    out = ["\n#### Goals (" + ", ".join(shapes) + "; 'shipped' = our file where written, else stock)\n",
           "| shape | M=1 step stock → shipped (ratio; goal ≤ 0.75) | M≥16 GEMMs at ≥ 0.90 of mem floor (shipped) | "
           "same, roofline floor | min frac w13 / w2 at M≥16 (mem floor) | w13 frac range 16≤M≤512 | w2 frac range 16≤M≤512 |",
           "|---|---|---|---|---|---|---|"]
    for shape in shapes:
        s = summary.get(shape)
        if not s:
            continue
        m1 = s.get(1)
        big = {M: x for M, x in s.items() if M >= 16}
        n_ok = sum((x["frac13"] >= 0.9) + (x["frac2"] >= 0.9) for x in big.values())
        n_rok = sum((x["rfrac13"] >= 0.9) + (x["rfrac2"] >= 0.9) for x in big.values())
        mid = {M: x for M, x in big.items() if M <= 512}
        out.append(f"| {shape} | {m1['stock']:.1f} → {m1['ship']:.1f} µs ({m1['ship'] / m1['stock']:.2f}) | "
                   f"{n_ok} of {2 * len(big)} | {n_rok} of {2 * len(big)} | {min(x['frac13'] for x in big.values()):.2f} / "
                   f"{min(x['frac2'] for x in big.values()):.2f} | "
                   f"{min(x['frac13'] for x in mid.values()):.2f}-{max(x['frac13'] for x in mid.values()):.2f} | "
                   f"{min(x['frac2'] for x in mid.values()):.2f}-{max(x['frac2'] for x in mid.values()):.2f} |")
    return "\n".join(out)


def jit_section(path):
    d = json.load(open(path))
    out = [f"Kernel sources: stock `{d['stock_decorator']}`; patched `{d['patched_decorator']}` (the whole "
           "series applied to the pinned fused_moe.py). Stock runs use stock vLLM's configs, patched runs our "
           "files (the image). Each sweep starts with an empty in-process kernel cache and a fresh "
           "`TRITON_CACHE_DIR`; compiles counted with Triton's `knobs.runtime.jit_post_compile_hook`; one count = "
           "one compiled kernel variant (w13 and w2 are separate variants: different N/K/top_k constexprs; the "
           "split-K kernel counts too).\n",
           "| sweep | stock: (GEMM, config) pairs, compiles (time) | patched: (GEMM, config) pairs, compiles (time) |",
           "|---|---|---|"]
    if "stock_fixed_1_64" in d:
        s, p = d["stock_fixed_1_64"], d["patched_fixed_1_64"]
        out.append(f"| one config (`M16N64K128G1w4s4`), M = 1..64, w13+w2 | 2, {s['traffic']['compiles']} "
                   f"({s['traffic']['compile_s']:.1f} s) | 2, {p['traffic']['compiles']} "
                   f"({p['traffic']['compile_s']:.1f} s) |")
    extra = d.get("extended_warmup_extra_ms") or {}
    for lab, what in (("", "vLLM's warm-up (capture sizes 1,2,4,8..512 + 8192)"),
                      ("_extwarm", "warm-up extended by M = {} (stock) / {} (patched)".format(
                          extra.get("stock"), extra.get("patched")))):
        s, p = d.get("stock" + lab), d.get("patched" + lab)
        if not (s and p):
            continue
        out.append(f"| per-M dispatch, {what} | {s['distinct_gemm_configs']}, {s['warmup']['compiles']} "
                   f"({s['warmup']['compile_s']:.1f} s) | {p['distinct_gemm_configs']}, {p['warmup']['compiles']} "
                   f"({p['warmup']['compile_s']:.1f} s) |")
        out.append(f"| then traffic M = 1..8192 (compiles after that warm-up) | {s['traffic']['compiles']} "
                   f"({s['traffic']['compile_s']:.1f} s) | {p['traffic']['compiles']} "
                   f"({p['traffic']['compile_s']:.1f} s) |")
    s, p = d.get("stock"), d.get("patched")
    if s and p:
        out.append("\nFirst compiles after vLLM's warm-up (M, variants, config): stock "
                   f"{[tuple(x) for x in s['traffic']['new_at']][:8]}; patched "
                   f"{[tuple(x) for x in p['traffic']['new_at']]}.\n")
    if d.get("steady_state"):
        out.append("Steady state, w13 + w2 CUPTI µs, the same (stock vLLM's) per-M config for all three; stock "
                   "timed twice for noise:\n")
        out.append("| M | config | stock (a) | patched | stock (b) | patched vs mean stock | stock a-b spread |")
        out.append("|---|---|---|---|---|---|---|")
        for r in d["steady_state"]:
            out.append(f"| {r['M']} | `{r['cfg']}` | {r['stock_a']:.2f} | {r['patched']:.2f} | {r['stock_b']:.2f} | "
                       f"{r['patched_vs_stock'] * 100:+.1f}% | {r['noise'] * 100:.1f}% |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--jit", nargs="*", default=[], help="jit_*.json runs to tabulate (none: the bench alone)")
    ap.add_argument("--shapes", default=None, help="comma list: tabulate these shapes of the bench only")
    ap.add_argument("--configs-dir", default=str(CONFIGS_DIR), help="the shipped configs (default: configs/)")
    args = ap.parse_args(argv)
    t, summary = bench_tables(args.bench, args.configs_dir, args.shapes.split(",") if args.shapes else None)
    print(t)
    # the goals of the TP8 run (runs 1-2) are the TP8 shapes; of another run, its shapes
    print(goals(summary, [s for s in TP8_SHAPES if s in summary] or list(summary)))
    for path in args.jit:
        shape = json.load(open(path)).get("patched", {}).get("shape", "?")
        print(f"\n#### JIT compiles, {shape}\n")
        print(jit_section(path))


if __name__ == "__main__":
    main()
