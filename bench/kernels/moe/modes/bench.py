"""bench: stock vLLM against the image (and a previous config set) per shape, M
and GEMM; optionally swap-AB forced off; fraction of the memory floor."""
from __future__ import annotations

import time

from ..context import RunContext
from ..configs import cfg_clean, entry_str, try_get_config
from ..launch import enable_swap_ab
from ..problem import ShapeCtx
from ..shapes import SHAPES
from ..timing import attach_cupti, run_config


def bench_variants(run: RunContext, sh, M):
    """(name, config entry, forced swap, where from, kernel source): stock =
    stock vLLM (stock source, its file or default); ours = the image (patched
    source, --configs-dir); prev = --prev-configs-dir with the patched source."""
    variants = []
    cs, src_s = try_get_config(sh, M, [run.stock_configs_dir])
    variants.append(("stock", cfg_clean(cs), None, src_s, "stock"))
    if run.opts.noswap and enable_swap_ab(cs["BLOCK_SIZE_M"], cs["BLOCK_SIZE_N"]):
        variants.append(("stock_noswap", cfg_clean(cs), False, src_s, "stock"))
    for vname, folder in (("ours", run.opts.configs_dir), ("prev", run.opts.prev_configs_dir)):
        if folder:
            co, src_o = try_get_config(sh, M, [folder])
            if src_o != "default":
                variants.append((vname, co, None, src_o, "patched"))
                if run.opts.noswap and vname == "ours" and enable_swap_ab(co["BLOCK_SIZE_M"], co["BLOCK_SIZE_N"]):
                    variants.append(("ours_noswap", co, False, src_o, "patched"))
    return variants


def mode_bench(run: RunContext):
    """stock vLLM vs ours (and prev); optionally swap-AB forced off; floor fraction."""
    kmods = {"stock": run.kstock, "patched": run.kpatched or run.kstock}
    rows = []
    for name in run.opts.shapes:
        sh = SHAPES[name]
        for M in run.opts.ms:
            for vname, cfg, swap, src, tag in bench_variants(run, sh, M):
                run.pc.submit(("bench", tag, name, entry_str(cfg), M, swap), tag, name, cfg, [M], (swap,))
    for name in run.opts.shapes:
        if time.time() > run.t_end:
            print(f"[bench] deadline: skip {name}", flush=True)
            continue
        ctx = ShapeCtx(name, run.dev)
        sh = ctx.shape
        for M in run.opts.ms:
            if time.time() > run.t_end:
                break
            variants = bench_variants(run, sh, M)
            for vname, cfg, swap, src, tag in variants:
                run.pc.wait(("bench", tag, name, entry_str(cfg), M, swap), run.t_end)
            for g in ("w13", "w2"):
                floor_us = ctx.floor_s(M, g, run.bw) * 1e6
                recs = []
                for vname, cfg, swap, src, tag in variants:
                    r = run_config(ctx, kmods[tag], M, g, cfg, swap_ab=swap, reps=run.opts.reps, want_graph=True)
                    r.update(shape=name, M=M, gemm=g, variant=vname, src=src, floor_us=floor_us,
                             entry=entry_str(cfg), kernel_source=tag)
                    recs.append(r)
                attach_cupti(recs, enabled=not run.opts.no_cupti)
                rows += recs
                for r in recs:
                    t = r.get("cupti_us", float("nan"))
                    if not (t == t):
                        t = r["us"]
                    r["frac_floor"] = floor_us / t if t and t != float("inf") else 0.0
                    print(f"[bench] {name:22s} M={M:5d} {g:3s} {r['variant']:12s} {r['cfg']:22s} swap={int(r['swap'])}"
                          f" graph={r['us']:8.2f}us cupti={r.get('cupti_us', float('nan')):8.2f}us floor={floor_us:7.2f}us"
                          f" frac={r['frac_floor']:.2f} ok={r['ok']} src={r['src']}", flush=True)
            ctx.drop_m(M)
        del ctx
        run.shape_done(f"bench_{run.opts.tag}.json", {"bw": run.bw, "rows": rows})
    run.dump(f"bench_{run.opts.tag}.json", {"bw": run.bw, "rows": rows})
    return rows
