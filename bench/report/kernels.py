"""The fused-MoE kernel table: one decode step's two GEMMs (w13, w2) with stock vLLM's config against the image's
tuned config and kernel, from the kernel benches' records (`python -m bench.kernels.moe --mode bench`)."""
from __future__ import annotations

import json
from pathlib import Path

from bench.kernels.moe.shapes import SHAPES

# The bench records the table reads, a later one replacing an earlier one's shapes
BENCHES = ("bench_b5.json", "h200_block_10/bench_bblock.json", "h200_block_10/bench_btp4.json")
TOKENS = (1, 8, 64)


def step_us(rows: list[dict], shape: str, m: int, variant: str) -> float | None:
    """w13 + w2 of one shape at m tokens: the kernels' CUPTI time where recorded, else the CUDA-graph time a launch."""
    times = [r["cupti_us"] if r.get("cupti_us") == r.get("cupti_us") and r.get("cupti_us") is not None else r["us"]
             for r in rows if r["shape"] == shape and r["M"] == m and r["variant"] == variant]
    return sum(times) if len(times) == 2 else None


def kernel_table(data: Path) -> tuple[list[str], list[str]]:
    """A row per rank shape: the step at one token, stock's and the image's, and the image/stock ratio at TOKENS;
    and the bench records it cites (paths under data)."""
    by_shape: dict[str, tuple[str, list[dict]]] = {}
    for name in BENCHES:
        rows = json.loads((data / name).read_text())["rows"]
        by_shape.update({r["shape"]: (name, rows) for r in rows})
    out = ["| rank (experts, N, hidden) | FP8 | one token: stock → image (µs) | image/stock at "
           + ", ".join(map(str, TOKENS)) + " tokens | data |", "|---|---|---|---|---|"]
    for shape, (name, rows) in by_shape.items():
        sh = SHAPES[shape]
        stock, image = step_us(rows, shape, 1, "stock"), step_us(rows, shape, 1, "ours")
        ratios = [(s, i) for m in TOKENS
                  if (s := step_us(rows, shape, m, "stock")) and (i := step_us(rows, shape, m, "ours"))]
        out.append(f"| {shape} ({sh['E']}, {sh['N']}, {sh['H']}) | {'block' if sh['block'] else 'per-tensor'} | "
                   f"{stock:.1f} → {image:.1f} | {' / '.join(f'{i / s:.2f}' for s, i in ratios)} | `{name}` |")
    return out, list(BENCHES)
