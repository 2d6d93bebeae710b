"""Timing: copy bandwidth (the floor's denominator), CUDA-graph replays over
rotated input sets, CUPTI kernel times (torch.profiler), and one checked, timed
run of a config.
"""
from __future__ import annotations

import statistics
import time

import torch

from .configs import cfg_str, gemm_config
from .launch import swap_of
from .problem import ShapeCtx, check


def measure_copy_bandwidth(dev, nbytes=2 << 30, reps=20):
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    src.random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    t = statistics.median(ts)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / t  # bytes read + written per second


def time_graph(fns, reps=20, warm=2):
    """Per-launch time (us): graph of all fns, median over replays / len(fns)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(s)
    # warm until >= 10 ms of replays: the first variant timed after a heavy
    # reference computation measured ~6% slow with a fixed 2-replay warm-up
    t_w = time.perf_counter()
    n_w = 0
    while n_w < warm or time.perf_counter() - t_w < 0.01:
        g.replay()
        torch.cuda.synchronize()
        n_w += 1
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in evs:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ts = [a.elapsed_time(b) * 1e3 / len(fns) for a, b in evs]
    return statistics.median(ts), g


def cupti_kernel_times(graphs_counts, replays=3, rounds=2):
    """min over `rounds` interleaved rounds of cupti_kernel_times_once."""
    best = None
    for _ in range(rounds):
        r = cupti_kernel_times_once(graphs_counts, replays)
        best = r if best is None else [min(a, b) if a == a and b == b else (a if a == a else b)
                                       for a, b in zip(best, r)]
    return best


def attach_cupti(records, enabled=True):
    """Take the CUDA graph out of each record that has one (run_config's "_graph")
    and, if enabled, store its CUPTI kernel time as "cupti_us" (one interleaved
    pass over all of them)."""
    timed = [r for r in records if "_graph" in r]
    graphs = [r.pop("_graph") for r in timed]
    if graphs and enabled:
        for r, k in zip(timed, cupti_kernel_times(graphs)):
            r["cupti_us"] = k


def cupti_remeasure(ctx: ShapeCtx, M, gemm, runs, reps=3, enabled=True):
    """Run each (kernel module, config) of `runs` again as a CUDA graph of `reps`
    replays (run_config), then, if enabled, time all the graphs with CUPTI in one
    interleaved pass (attach_cupti). Returns the run_config records in order, each
    with its "cupti_us" (NaN where the config failed or CUPTI was not asked for)."""
    recs = [run_config(ctx, kmod, M, gemm, config, reps=reps, want_graph=True) for kmod, config in runs]
    attach_cupti(recs, enabled)
    for r in recs:
        r.setdefault("cupti_us", float("nan"))
    return recs


def cupti_kernel_times_once(graphs_counts, replays=3):
    """CUPTI (torch.profiler) kernel durations: for each (graph, launches per
    replay) returns the median fused_moe_kernel duration in us (NaN if absent)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except Exception:
        return [float("nan")] * len(graphs_counts)
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for g, _ in graphs_counts:
                for _ in range(replays):
                    g.replay()
                torch.cuda.synchronize()
        evs = [e for e in prof.events() if "fused_moe_kernel" in e.name and e.device_type.name == "CUDA"]
        evs.sort(key=lambda e: e.time_range.start)
        want = sum(c * replays for _, c in graphs_counts)
        if len(evs) != want:
            return [float("nan")] * len(graphs_counts)
        out, i = [], 0
        for _, c in graphs_counts:
            chunk = evs[i: i + c * replays]
            i += c * replays
            out.append(statistics.median([e.time_range.end - e.time_range.start for e in chunk]))
        return out
    except Exception as ex:  # noqa: BLE001
        print(f"[cupti] unavailable: {ex!r}", flush=True)
        return [float("nan")] * len(graphs_counts)


def run_config(ctx: ShapeCtx, kmod, M, gemm, config, swap_ab=None, reps=20, want_graph=False):
    """check + time one (config, gemm, M). Returns dict."""
    gc = gemm_config(config, gemm)
    res = {"cfg": cfg_str(gc), "swap": swap_of(gc, swap_ab)}
    try:
        ok, err = check(kmod, ctx.shape, gemm, ctx.get_inputs(M, 0), ctx.W[gemm], config, ctx.ref(M, gemm), swap_ab)
    except Exception as ex:  # noqa: BLE001  (OutOfResources etc.)
        res.update(ok=False, err=repr(ex)[:200], us=float("inf"))
        return res
    res["relerr"] = err
    if not ok:
        res.update(ok=False, us=float("inf"))
        return res
    fns = ctx.fns(kmod, M, gemm, config, swap_ab)
    us, g = time_graph(fns, reps=reps)
    res.update(ok=True, us=us, nsets=len(fns))
    if gc.get("SPLIT_K", 1) > 1:
        # split-K must leave its workspace zeroed: check again after the replays
        ok2, err2 = check(kmod, ctx.shape, gemm, ctx.get_inputs(M, 0), ctx.W[gemm], config, ctx.ref(M, gemm), swap_ab)
        if not ok2:
            res.update(ok=False, us=float("inf"), err=f"after timing: relerr={err2}")
    if want_graph:
        res["_graph"] = (g, len(fns))
    else:
        del g
    return res
