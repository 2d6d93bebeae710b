"""GPU time by kernel class, from a torch-profiler trace of a short streamed run (--profile)."""
from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

from tools.launcher_process import Server

from .workload import Workload, request_ok, requests_for

KERNEL_CLASSES = (
    # vLLM's fused-MoE kernels and patch 0011/0012's matrix-vector ones (lmi_fused_moe_gemv[_silu]_kernel)
    ("moe_gemm", re.compile(r"fused_moe_kernel|lmi_fused_moe_gemv")),
    ("attention", re.compile(r"flash|attn|attention|fmha|reshape_and_cache|paged", re.I)),
    ("other_gemm", re.compile(r"gemm|gemv|xmma|nvjet|cutlass|scaled_mm|matmul|sm90_", re.I)),
)


GPU_EVENT_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
TOP_KERNELS = 40
# vLLM's model runner names each step's profiler range by its batch: execute_context_<requests>(<prompt tokens>)
# _generation_<requests>(<decode tokens>); the trace has it on the host (user_annotation) and on the GPU
# (gpu_user_annotation, the span of the step's GPU work).
STEP_RANGE = re.compile(r"^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$")
STEP_SIDES = {"user_annotation": "host_ms", "gpu_user_annotation": "gpu_ms"}


def step_kinds(events: list[dict]) -> dict[str, dict]:
    """Each kind of engine step in a window (vLLM's step ranges): how many ran, and the mean span of one on the
    host and on the GPU, in ms. A prefill above the largest CUDA graph shows here as a long step."""
    spans: dict[str, dict[str, list[float]]] = {}
    for e in events:
        side = STEP_SIDES.get(e.get("cat", ""))
        if side and "dur" in e and STEP_RANGE.match(e.get("name", "")):
            spans.setdefault(e["name"], {}).setdefault(side, []).append(e["dur"] / 1e3)
    return {name: {"n": max(len(v) for v in sides.values()),
                   **{side: round(sum(v) / len(v), 3) for side, v in sorted(sides.items())}}
            for name, sides in sorted(spans.items())}


def gpu_occupancy(work: list[dict]) -> dict:
    """How much of the window the GPU worked: the span from its first piece of work (a kernel, memset or copy;
    sorted by start) to the end of its last, and the time within it that some work ran (overlapping work counted
    once), in ms. What is left is the GPU waiting on the host: the scheduler, the sampler, launches outside a graph."""
    busy = span_end = 0.0
    start = work[0]["ts"] if work else 0.0
    for e in work:
        end = e["ts"] + e["dur"]
        busy += max(0.0, end - max(e["ts"], span_end))
        span_end = max(span_end, end)
    return {"gpu_busy_ms": busy / 1e3, "gpu_span_ms": (span_end - start) / 1e3 if work else 0.0}


def classify(trace_path: Path) -> dict:
    with gzip.open(trace_path, "rt") if trace_path.suffix == ".gz" else open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    # memsets and copies are GPU work of the step too: vLLM's dynamic FP8 quantization clears its scale with a
    # memset (0.85 us each, 2.4% of a one-client window on an H200), which kernels alone would not count
    kernels = sorted((e for e in events if e.get("cat") in GPU_EVENT_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    us: dict[str, float] = {}
    other: dict[str, float] = {}
    by_name: dict[str, list] = {}  # kernel name -> [launches, GPU us]
    moe_seen = 0
    for e in kernels:
        cls = next((c for c, rx in KERNEL_CLASSES if rx.search(e["name"])), "other")
        row = by_name.setdefault(e["name"][:120], [0, 0.0])
        row[0] += 1
        row[1] += e["dur"]
        if cls == "moe_gemm":
            # each MoE layer runs its w13 GEMM, then its w2 GEMM (the split-K kernel is one of them)
            cls = "moe_w13" if moe_seen % 2 == 0 else "moe_w2"
            moe_seen += 1
        if cls == "other":
            other[e["name"][:80]] = other.get(e["name"][:80], 0) + e["dur"]
        us[cls] = us.get(cls, 0) + e["dur"]
    total = sum(us.values()) or 1
    return {"total_gpu_ms": total / 1e3, "share": {k: round(v / total, 4) for k, v in sorted(us.items())},
            "moe_launches": moe_seen, **gpu_occupancy(kernels),
            "top_other": sorted(other.items(), key=lambda kv: -kv[1])[:8],
            # every class's largest kernels, to pick a patch by (the trace itself stays on the GPU host)
            "top_kernels": [[name, n, round(t, 1)] for name, (n, t) in
                            sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]],
            "step_kinds": step_kinds(events)}


def profile_steps(concurrency: int, out_tokens: int) -> int:
    """Engine steps in a profile window (one wave of streamed requests): its requests run
    `concurrency` at a time, each for out_tokens steps (the first one its prefill)."""
    return -(-requests_for(concurrency, 1) // concurrency) * out_tokens


def profile(s: Server, wl: Workload, concurrency: int, prof_dir: Path, first: int) -> dict:
    """One profile window (a wave of streamed requests at `concurrency`, prompts from number `first` on) and its
    worker's trace, classified."""
    before = set(prof_dir.rglob("*.json*"))
    # vLLM answers both with an empty body, SGLang with a line of text
    request_ok(s.host, "POST", "/start_profile")
    measured = wl.latency(s.host, concurrency, 1, first)
    request_ok(s.host, "POST", "/stop_profile")
    end = time.monotonic() + 120
    new = []
    while time.monotonic() < end:
        new = sorted(p for p in set(prof_dir.rglob("*.json*")) - before if "rank0" in p.name or "rank" not in p.name)
        if new and all(p.stat().st_size > 0 for p in new):
            time.sleep(2)
            break
        time.sleep(1)
    if not new:
        return {"error": "no trace written"}
    worker = max(new, key=lambda p: p.stat().st_size)  # the GPU worker's trace is the large one
    # the window's own figures (under the profiler, so slower than the measured runs'), and its output tokens
    return {"trace": worker.name, **classify(worker), "out_tokens": measured["requests"] * wl.out,
            "window": {k: measured[k] for k in ("stream_tok_s", "ttft_p50_ms", "itl_p50_ms", "itl_p99_ms")}}
