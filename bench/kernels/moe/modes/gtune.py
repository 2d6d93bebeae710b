"""gtune: per-GEMM tuning with the patched kernel source (patches 0003/0004)."""
from __future__ import annotations

import time

from ..context import RunContext
from ..configs import GEMM_NAMES, cfg_clean, cfg_str, entry_str, make_entry, try_get_config
from ..shapes import SHAPES
from ..space import candidate_configs, compile_variant_ms, gemm_variants
from ..timing import cupti_remeasure, run_config


def mode_gemm_tune(run: RunContext):
    """Per-GEMM tuning with the patched kernel source (patches 0003/0004): for
    each (shape, M) and GEMM, time the base candidates, then the split-K /
    swap-off variants of the best few; pick the (w13, w2) pair with one BLOCK_SIZE_M
    (both GEMMs share the alignment) of least summed time; re-measure the
    best pairs and the stock choice (stock kernel source) with CUPTI."""
    kmod, kstock, space = run.kpatched, run.kstock, run.opts.space
    assert kmod is not None and hasattr(kmod, "fused_moe_kernel_split_k"), \
        "gtune needs --patched-fused-moe-py with patches 0003/0004"
    results = {}
    plan = list(run.opts.tune_plan)
    for name, ms in plan:
        sh = SHAPES[name]
        for M in ms:
            for g in GEMM_NAMES:
                for c in candidate_configs(sh, M, space):
                    run.pc.submit(("gt", name, g, cfg_str(c)), "patched", name, c, compile_variant_ms(sh, [M]),
                                  (None,), (g,))
    for name, ctx, M in run.plan_steps(plan, "gtune"):
        sh = ctx.shape
        results.setdefault(name, {})
        t0 = time.time()
        per = {g: [] for g in GEMM_NAMES}

        def try_cfgs(g, cfgs):
            for c in cfgs:
                key = ("gt", name, g, cfg_str(c))
                okc, info = run.pc.wait(key, run.t_end + 30)
                if not okc:
                    per[g].append({"cfg": cfg_str(c), "ok": False, "err": str(info)[-200:]})
                    continue
                r = run_config(ctx, kmod, M, g, c, reps=run.opts.reps)
                r["config"] = c
                per[g].append(r)

        for g in GEMM_NAMES:
            try_cfgs(g, candidate_configs(sh, M, space))
            okb = sorted((r for r in per[g] if r.get("ok")), key=lambda r: r["us"])
            # split-K / swap-off variants of the best few base configs and of the best per BLOCK_SIZE_M
            seeds, seen_bm = okb[: run.opts.seeds], set()
            for r in okb:
                if r["config"]["BLOCK_SIZE_M"] not in seen_bm:
                    seen_bm.add(r["config"]["BLOCK_SIZE_M"])
                    if r not in seeds:
                        seeds.append(r)
            var = {}
            for r in seeds:
                for v in gemm_variants(sh, M, g, r["config"]):
                    var.setdefault(cfg_str(v), v)
            for v in var.values():
                run.pc.submit(("gt", name, g, cfg_str(v)), "patched", name, v, compile_variant_ms(sh, [M]),
                              (None,), (g,))
            try_cfgs(g, list(var.values()))
        ok = {g: [r for r in per[g] if r.get("ok")] for g in GEMM_NAMES}
        cs, src = try_get_config(sh, M, [run.stock_configs_dir])
        cs = cfg_clean(cs)
        # pairs: best per GEMM for each shared BLOCK_SIZE_M
        pairs = []
        for bm in sorted({r["config"]["BLOCK_SIZE_M"] for r in ok["w13"]} &
                         {r["config"]["BLOCK_SIZE_M"] for r in ok["w2"]}):
            b13 = sorted((r for r in ok["w13"] if r["config"]["BLOCK_SIZE_M"] == bm), key=lambda r: r["us"])
            b2 = sorted((r for r in ok["w2"] if r["config"]["BLOCK_SIZE_M"] == bm), key=lambda r: r["us"])
            pairs.append((b13[0]["us"] + b2[0]["us"], bm, b13[: run.opts.topk_cupti], b2[: run.opts.topk_cupti]))
        pairs.sort(key=lambda p: p[0])
        rec = {"stock": {"cfg": cfg_str(cs), "src": src}, "floor_w13_us": ctx.floor_s(M, "w13", run.bw) * 1e6,
               "floor_w2_us": ctx.floor_s(M, "w2", run.bw) * 1e6,
               "n_tried": {g: len(per[g]) for g in GEMM_NAMES}, "n_ok": {g: len(ok[g]) for g in GEMM_NAMES}}
        if pairs and not run.opts.no_cupti:
            # CUPTI: top configs of the 2 best BLOCK_SIZE_M, plus stock (stock kernel source)
            for g in GEMM_NAMES:
                cands = []
                for p in pairs[:2]:
                    cands += p[2] if g == "w13" else p[3]
                recs = cupti_remeasure(ctx, M, g, [(kmod, r["config"]) for r in cands] + [(kstock, cs)])
                for r, rr in zip(cands, recs):
                    r["cupti_us"] = rr["cupti_us"]
                rec["stock"][f"{g}_cupti_us"] = recs[-1]["cupti_us"]
                rec["stock"][f"{g}_us"] = recs[-1]["us"]
            best = None
            for p in pairs[:2]:
                b13 = min(p[2], key=lambda r: r.get("cupti_us", float("inf")))
                b2 = min(p[3], key=lambda r: r.get("cupti_us", float("inf")))
                tot = b13.get("cupti_us", float("inf")) + b2.get("cupti_us", float("inf"))
                if best is None or tot < best[0]:
                    best = (tot, b13, b2)
            tot, b13, b2 = best
            entry = make_entry(b13["config"], b2["config"])
            rec["best"] = {"entry": entry, "str": entry_str(entry), "w13_cupti_us": b13["cupti_us"],
                           "w2_cupti_us": b2["cupti_us"], "total_cupti_us": tot,
                           "w13_us": b13["us"], "w2_us": b2["us"]}
            st = rec["stock"]
            rec["ratio"] = tot / (st["w13_cupti_us"] + st["w2_cupti_us"])
        # what each kind of variant achieves alone (graph timer), for the record
        fam = {}
        for g in GEMM_NAMES:
            for r in ok[g]:
                c = r["config"]
                kind = "split" if c.get("SPLIT_K", 1) > 1 else "noswap" if "SWAP_AB" in c else "base"
                k2 = f"{g}_{kind}"
                if k2 not in fam or r["us"] < fam[k2]["us"]:
                    fam[k2] = {"cfg": r["cfg"], "us": r["us"]}
        rec["best_by_kind"] = fam
        if run.opts.keep_all:
            rec["all"] = {g: [{k: v for k, v in r.items() if k != "config"} for r in per[g]] for g in GEMM_NAMES}
        results[name][M] = rec
        b = rec.get("best", {})
        st = rec["stock"]
        print(f"[gtune] {name:22s} M={M:5d} best {b.get('str')} "
              f"{b.get('w13_cupti_us', float('nan')):.2f}+{b.get('w2_cupti_us', float('nan')):.2f}"
              f"={b.get('total_cupti_us', float('nan')):.2f}us stock {st['cfg']}({src}) "
              f"{st.get('w13_cupti_us', float('nan')):.2f}+{st.get('w2_cupti_us', float('nan')):.2f} "
              f"ratio={rec.get('ratio', float('nan')):.3f} floor={rec['floor_w13_us']:.2f}+{rec['floor_w2_us']:.2f} "
              f"frac={rec['floor_w13_us'] / b.get('w13_cupti_us', float('inf')):.2f}/"
              f"{rec['floor_w2_us'] / b.get('w2_cupti_us', float('inf')):.2f} "
              f"tried={rec['n_tried']} t={time.time() - t0:.1f}s", flush=True)
        print(f"[gtune] {name:22s} M={M:5d} by kind: " + " ".join(
            f"{k}={v['cfg']}:{v['us']:.2f}" for k, v in sorted(fam.items())), flush=True)
        run.dump(f"gtune_{run.opts.tag}.json", {"bw": run.bw, "results": results})
    run.dump(f"gtune_{run.opts.tag}.json", {"bw": run.bw, "results": results})
    return results
