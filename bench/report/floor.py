"""The performance page's decode-step tables: each recorded profile window of a deployment-depth model against its
memory floor (bench.e2e.floor), and the newest run's image windows per layer."""
from __future__ import annotations

import re

from bench.e2e.floor import floor_data

from .runs import Run, is_layout

ARMS = ("stock",)  # profiled beside the run's image arm


def windows(run: Run) -> list[tuple[str, str, dict]]:
    """(model, window, floor_data) of each window of a run that bench.e2e.floor reads: deployment-depth models, the
    image arm's and stock's windows, recorded with their kernels and steps, by arm then clients."""
    found = []
    for model, m in run.results.get("models", {}).items():
        if not is_layout(model):
            continue
        for w in m.get("profile") or {}:
            arm, _, c = w.rpartition(".c")
            if arm not in (run.image_arm, *ARMS) or not c.isdigit():
                continue
            try:
                found.append((model, w, floor_data(run.results, model, w, run.gpu)))
            except ValueError:  # a window recorded without its kernels or steps
                continue
    return sorted(found, key=lambda f: (f[0], f[1].rpartition(".c")[0] != run.image_arm, f[2]["c"]))


def layer_table(run: Run, model: str, d: dict) -> list[str]:
    """One window's per-layer table (floor_data's rows) under its heading, and the step's totals."""
    bw = d["bandwidth"]
    lines = ["", f"### {run.folder}: {model}, image, {d['c']} client{'s' if d['c'] > 1 else ''} ({run.gpu})", "",
             "| scope | role | kernels | launches | µs | MB read | floor µs | share of floor |",
             "|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        f = r.floor_us(bw)
        share = f"{f / r.us:.0%}" if r.bytes and r.us else "-"
        kernels = re.sub(r"\|", "/", ", ".join(r.kernels)) or "-"
        lines.append(f"| {'layer' if r.scope == 'layer' else 'step'} | {r.role} | {kernels} | "
                     f"{r.launches:.2f} | {r.us:.2f} | {r.bytes / 1e6:.3f} | {f:.2f} | {share} |")
    return lines + ["", f"One step: {d['step_us']:.0f} µs of GPU time, floor {d['floor_us']:.0f} µs "
                        f"({d['floor_us'] / d['step_us']:.0%}); context {d['context']} tokens, {d['layers']} layers."]


def floor_sections(runs: list[Run]) -> tuple[list[str], set[str]]:
    """The summary of every run's windows and the newest run's per-layer tables; the runs cited."""
    rows, cited, newest = [], set(), None
    for run in runs:
        found = windows(run)
        for model, w, d in found:
            arm = w.rpartition(".c")[0]
            rows.append(f"| [{run.folder}](../bench/data/{run.folder}/) | {run.gpu} | {model} | "
                        f"{'image' if arm == run.image_arm else arm} | {d['c']} | {d['step_us']:.0f} | "
                        f"{d['floor_us']:.0f} | {d['floor_us'] / d['step_us']:.0%} |")
        if found:
            cited.add(run.folder)
            newest = (run, found)
    if not rows:
        return ["No run has recorded a profile window with its kernels yet."], cited
    lines = ["| run | GPU | model | arm | clients | step (µs, GPU time under the profiler) | floor (µs) | "
             "step's share of its floor |", "|---|---|---|---|---|---|---|---|", *rows]
    run, found = newest
    for model, w, d in found:
        if w.rpartition(".c")[0] == run.image_arm:
            lines += layer_table(run, model, d)
    return lines, cited
