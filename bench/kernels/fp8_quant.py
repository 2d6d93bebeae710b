"""Patch 0006 on the GPU: the one-launch dynamic per-tensor FP8 quantization against vLLM's op
(`ops.scaled_fp8_quant`: memset, abs-max kernel, quantization kernel) on the fused MoE's decode inputs.

    python -m bench.kernels.fp8_quant --out DIR      (the image's Python: vLLM with the series applied)

For each input (w13: tokens x hidden; w2: tokens x top-k x N, of the TP8 shards, up to 16 Ki elements) it
checks that both give the same fp8 bytes and scale, then times each inside a CUDA graph of 100 calls, as
vLLM's decode runs them, replayed alternately (vLLM's op, one launch, ...) 7 times: microseconds per call, the
median and the range. Inputs above the patch's limit are timed too (the kernel at the next power-of-two
block), to show where the limit belongs; the "patched vLLM runs" column says which path serves each.
Prints a markdown table and writes fp8_quant.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench.kernels.graph_timing import CALLS, REPS, alternate, graph_of

SHAPES = {  # name -> (hidden or top-k x N); rows = tokens (w13) or tokens x top-k (w2)
    "qwen3-235b-tp8 w13": (1, 4096), "qwen3-235b-tp8 w2": (8, 192),
    "qwen3-coder-480b-tp8 w13": (1, 6144), "qwen3-coder-480b-tp8 w2": (8, 320),
}
TOKENS = (1, 2, 4, 8)
MAX_TIMED = 16384


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe import utils

    def vllm_op(x):
        return ops.scaled_fp8_quant(x, None, use_per_token_if_dynamic=False)

    def one_launch(x):  # the patch's kernel at the next power-of-two block, also above the patch's own limit
        q = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
        scale = torch.empty(1, device=x.device, dtype=torch.float32)
        utils._launch_one_launch_quant(x, q, scale, max(2048, 1 << (x.numel() - 1).bit_length()))
        return q, scale
    torch.manual_seed(0)
    rows, results = [], {"device": torch.cuda.get_device_name(), "calls_per_graph": CALLS, "reps": REPS,
                         "cases": {}}
    for name, (per_token_rows, width) in SHAPES.items():
        for tokens in TOKENS:
            x = torch.randn(tokens * per_token_rows, width, device="cuda", dtype=torch.bfloat16) * 3
            if x.numel() > MAX_TIMED:
                continue
            served = "one launch" if utils._use_one_launch_quant(x) else "vLLM's op"
            q0, s0 = vllm_op(x)
            q1, s1 = one_launch(x)
            same_q = bool(torch.equal(q0.view(torch.uint8), q1.view(torch.uint8)))
            same_s = bool(torch.equal(s0.reshape(1), s1.reshape(1)))
            graphs = {"vllm": graph_of(vllm_op, x), "one_launch": graph_of(one_launch, x)}
            timed = alternate(graphs, "vllm", "one_launch")
            t, ratios = timed["us"], timed["ratio_range"]
            case = {"numel": x.numel(), "served_by": served, "same_fp8_bytes": same_q, "same_scale": same_s,
                    "us_vllm": t["vllm"], "us_one_launch": t["one_launch"], "ratio_median": timed["ratio_median"],
                    "ratio_range": timed["ratio_range"]}
            results["cases"][f"{name} {tokens} tok"] = case
            rows.append(f"| {name} | {tokens} | {x.numel()} | {served} | {same_q and same_s} | "
                        f"{statistics.median(t['vllm']):.2f} | {statistics.median(t['one_launch']):.2f} | "
                        f"{case['ratio_median']:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
    zero = torch.zeros(4, 4096, device="cuda", dtype=torch.bfloat16)
    (qz0, sz0), (qz1, sz1) = vllm_op(zero), one_launch(zero)
    results["all_zero_same"] = bool(torch.equal(qz0.view(torch.uint8), qz1.view(torch.uint8))
                                    and torch.equal(sz0.reshape(1), sz1.reshape(1)))
    table = ["| input | tokens | elements | patched vLLM runs | same fp8 bytes and scale | vLLM op us/call | "
             "one launch us/call | one launch / vLLM (range) |", "|---|---|---|---|---|---|---|---|"] + rows
    table.append(f"\nall-zero input, same bytes and scale: {results['all_zero_same']}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "fp8_quant.json").write_text(json.dumps(results, indent=1))
    (a.out / "fp8_quant.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0 if all(c["same_fp8_bytes"] and c["same_scale"] for c in results["cases"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
