"""Time a small GPU op the way vLLM's decode runs it: many calls captured in one CUDA graph, replayed.

Shared by the kernel benches of patches 0006 (fp8_quant), 0007 (router_topk) and 0010 (decode_gemm).
"""
from __future__ import annotations

import statistics

import torch

CALLS = 100
REPS = 7


def graph_of(fn, *args) -> torch.cuda.CUDAGraph:
    """`fn(*args)` CALLS times in one CUDA graph, after three eager calls on a side stream (compiles, caches)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn(*args)
    return g


def time_us(g: torch.cuda.CUDAGraph) -> float:
    """Microseconds per call of one replay (after an unmeasured one)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / CALLS


def in_turn(graphs: dict[str, torch.cuda.CUDAGraph]) -> dict[str, list[float]]:
    """Replay the graphs in turn REPS times: each one's per-call times, one a round."""
    t = {k: [] for k in graphs}
    for _ in range(REPS):
        for k, g in graphs.items():
            t[k].append(time_us(g))
    return t


def alternate(graphs: dict[str, torch.cuda.CUDAGraph], baseline: str, candidate: str) -> dict:
    """Replay the graphs in turn REPS times; per-call times of each and the candidate/baseline ratios."""
    t = in_turn(graphs)
    ratios = [c / b for b, c in zip(t[baseline], t[candidate])]
    return {"us": t, "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}
