"""probe: per-GEMM CUPTI times of given configs with swap-AB as vLLM decides,
forced on and forced off."""
from __future__ import annotations

from ..context import RunContext
from ..configs import cfg_str, parse_cfg
from ..problem import ShapeCtx
from ..timing import attach_cupti, run_config


def _line(r):
    return (f"[probe] {r['shape']:22s} M={r['M']:5d} {r['gemm']:3s} {r['cfg']:22s} forced={r['forced']:5s} "
            f"swap={int(r['swap'])} cupti={r.get('cupti_us', float('nan')):8.2f}us graph={r['us']:8.2f}us "
            f"ok={r['ok']} floor={r['floor_us']:.2f}")


def mode_probe(run: RunContext):
    """Per-GEMM CUPTI times of given configs, swap-AB as vLLM decides / forced on
    / forced off: data for proposed kernel-side changes (relaxed swap rule,
    separate w13/w2 configs)."""
    cfgs = [parse_cfg(x) for x in run.opts.probe_configs.split(",") if x]
    swaps = (None, True, False)
    for name in run.opts.shapes:
        for M in run.opts.ms:
            for c in cfgs:
                run.pc.submit(("probe", name, cfg_str(c), M), "stock", name, c, [M], swaps)
    rows = []
    for name in run.opts.shapes:
        ctx = ShapeCtx(name, run.dev)
        for M in run.opts.ms:
            for c in cfgs:
                run.pc.wait(("probe", name, cfg_str(c), M), run.t_end)
            for g in ("w13", "w2"):
                recs = []
                for c in cfgs:
                    for sw in swaps:
                        r = run_config(ctx, run.kstock, M, g, c, swap_ab=sw, reps=run.opts.reps, want_graph=True)
                        r.update(shape=name, M=M, gemm=g, forced=str(sw), floor_us=ctx.floor_s(M, g, run.bw) * 1e6)
                        recs.append(r)
                attach_cupti(recs)
                rows += recs
                for r in recs:
                    print(_line(r), flush=True)
            ctx.drop_m(M)
        del ctx
        run.shape_done(f"probe_{run.opts.tag}.json", {"bw": run.bw, "rows": rows})
    return rows
