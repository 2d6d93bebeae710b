"""tune: one config per M shared by w13 and w2 (what stock vLLM runs), searched
over the candidate space, the best re-measured with CUPTI against the stock choice."""
from __future__ import annotations

import time

from ..context import RunContext
from ..configs import cfg_clean, cfg_str, try_get_config
from ..shapes import SHAPES
from ..space import candidate_configs, compile_variant_ms
from ..timing import cupti_remeasure, run_config


def mode_tune(run: RunContext):
    # the kernel source tuned: patched (what the image ships) where given
    if run.opts.tune_with == "patched" and run.opts.patched_fused_moe_py:
        tune_tag, kmod = "patched", run.kpatched
    else:
        tune_tag, kmod = "stock", run.kstock
    space = run.opts.space
    results = {}
    plan = list(run.opts.tune_plan)
    # submit all compiles up front, in priority order
    n = 0
    for name, ms in plan:
        sh = SHAPES[name]
        per_cfg = {}
        for M in ms:
            cs, _ = try_get_config(sh, M, [run.stock_configs_dir])
            for c in candidate_configs(sh, M, space) + [cfg_clean(cs)]:
                per_cfg.setdefault(cfg_str(c), (c, []))[1].append(M)
        for key, (c, cms) in per_cfg.items():
            run.pc.submit(("tune", name, key), tune_tag, name, c, compile_variant_ms(sh, cms))
            n += 1
    print(f"[tune] submitted {n} compile jobs", flush=True)
    for name, ctx, M in run.plan_steps(plan, "tune"):
        sh = ctx.shape
        results.setdefault(name, {})
        t0 = time.time()
        best = None
        per = []
        for c in candidate_configs(sh, M, space):
            key = cfg_str(c)
            okc, info = run.pc.wait(("tune", name, key), run.t_end)
            if not okc:
                per.append({"cfg": key, "ok": False, "err": str(info)[-200:]})
                continue
            if time.time() > run.t_end + 30:
                break
            r13 = run_config(ctx, kmod, M, "w13", c, reps=run.opts.reps)
            if not r13["ok"]:
                per.append({"cfg": key, "ok": False, "err": r13.get("err", f"relerr={r13.get('relerr')}")})
                continue
            r2 = run_config(ctx, kmod, M, "w2", c, reps=run.opts.reps)
            if not r2["ok"]:
                per.append({"cfg": key, "ok": False, "err": r2.get("err", f"relerr={r2.get('relerr')}")})
                continue
            tot = r13["us"] + r2["us"]
            per.append({"cfg": key, "config": c, "ok": True, "w13_us": r13["us"], "w2_us": r2["us"],
                        "total_us": tot, "relerr13": r13["relerr"], "relerr2": r2["relerr"]})
            if best is None or tot < best["total_us"]:
                best = per[-1]
        # stock / default reference at this M (same timer)
        cs, src = try_get_config(sh, M, [run.stock_configs_dir])
        s13 = run_config(ctx, kmod, M, "w13", cs, reps=run.opts.reps)
        s2 = run_config(ctx, kmod, M, "w2", cs, reps=run.opts.reps)
        okp = [p for p in per if p.get("ok")]
        # re-measure the 3 fastest (graph timer) and the stock choice with CUPTI, interleaved
        top = sorted(okp, key=lambda p: p["total_us"])[: run.opts.topk_cupti]
        if top and s13["ok"] and s2["ok"] and not run.opts.no_cupti:
            cfgs = [p["config"] for p in top] + [cs]
            tot = [0.0] * len(cfgs)
            for g in ("w13", "w2"):
                ks = [r["cupti_us"] for r in cupti_remeasure(ctx, M, g, [(kmod, c) for c in cfgs])]
                for i, k in enumerate(ks):
                    tot[i] += k
                    key = f"{g}_cupti_us"
                    if i < len(top):
                        top[i][key] = k
                stock_cupti = ks[-1]
                if g == "w13":
                    s13["cupti_us"] = stock_cupti
                else:
                    s2["cupti_us"] = stock_cupti
            if all(t == t for t in tot):
                for i, p in enumerate(top):
                    p["total_cupti_us"] = tot[i]
                best = min(top, key=lambda p: p["total_cupti_us"])
        best13 = min(okp, key=lambda p: p["w13_us"]) if okp else None
        best2 = min(okp, key=lambda p: p["w2_us"]) if okp else None
        f13 = ctx.floor_s(M, "w13", run.bw) * 1e6
        f2 = ctx.floor_s(M, "w2", run.bw) * 1e6
        results[name][M] = {
            "best": best, "stock": {"cfg": cfg_str(cs), "src": src, "w13_us": s13["us"], "w2_us": s2["us"],
                                    "total_us": s13["us"] + s2["us"],
                                    "total_cupti_us": s13.get("cupti_us", float("nan")) + s2.get("cupti_us", float("nan"))},
            "top_cupti": [{k: p.get(k) for k in ("cfg", "total_us", "total_cupti_us")} for p in top],
            "best_w13_only": best13 and {"cfg": best13["cfg"], "us": best13["w13_us"]},
            "best_w2_only": best2 and {"cfg": best2["cfg"], "us": best2["w2_us"]},
            "floor_w13_us": f13, "floor_w2_us": f2, "n_tried": len(per), "n_ok": len(okp),
            "all": per if run.opts.keep_all else None,
        }
        b = best or {}
        print(f"[tune] {name:22s} M={M:5d} CUPTI w13+w2: best {b.get('total_cupti_us', float('nan')):.2f}us "
              f"stock {results[name][M]['stock']['total_cupti_us']:.2f}us", flush=True)
        print(f"[tune] {name:22s} M={M:5d} tried={len(per):3d} ok={len(okp):3d} "
              f"best={b.get('cfg')} {b.get('w13_us', 0):.2f}+{b.get('w2_us', 0):.2f}={b.get('total_us', 0):.2f}us "
              f"stock={cfg_str(cs)}({src}) {s13['us']:.2f}+{s2['us']:.2f}={s13['us'] + s2['us']:.2f}us "
              f"floor={f13:.2f}+{f2:.2f} t={time.time() - t0:.1f}s", flush=True)
        run.dump(f"tune_{run.opts.tag}.json", {"bw": run.bw, "results": results})
    run.dump(f"tune_{run.opts.tag}.json", {"bw": run.bw, "results": results})
    return results
