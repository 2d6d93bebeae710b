"""smoke: correctness of one swap-eligible config on the given shapes (naive and
aligned paths, swap-AB on and off, both GEMMs) plus one CUDA-graph timing."""
from __future__ import annotations

import torch

from ..context import RunContext
from ..configs import cfg_str
from ..problem import ShapeCtx, check
from ..timing import attach_cupti, run_config


def mode_smoke(run: RunContext):
    """Correctness of one swap-eligible config on the given shapes: naive and
    aligned paths, swap-AB on and off, both GEMMs; plus one CUDA-graph timing."""
    ok_all = True
    c = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
         "num_stages": 3}
    kmod = run.kstock
    for name in run.opts.smoke_shapes:
        ctx = ShapeCtx(name, run.dev, max_sets=4)
        sh = ctx.shape
        for M in (1, 64):
            for swap in (None, False):
                for g in ("w13", "w2"):
                    ok, err = check(kmod, sh, g, ctx.get_inputs(M, 0), ctx.W[g], c, ctx.ref(M, g), swap)
                    ok_all &= ok
                    print(f"[smoke] {name} M={M} {g} {cfg_str(c)} swap={swap} ok={ok} relerr={err:.2e}", flush=True)
            r = run_config(ctx, kmod, M, "w13", c, want_graph=True)
            attach_cupti([r])
            print(f"[smoke] timing {name} M={M} w13 graph={r['us']:.2f}us cupti={r['cupti_us']:.2f}us nsets={r['nsets']}",
                  flush=True)
            ctx.drop_m(M)
        del ctx
        torch.cuda.empty_cache()
    return ok_all
