"""Patch 0007 on the GPU: the one-pass softmax top-k routing kernel against vLLM's `topk_softmax` op.

    python -m bench.kernels.router_topk --out DIR      (the image's Python: vLLM with the series applied)

For the TP8 shards' routers (Qwen3-235B: 128 experts, Qwen3-Coder: 160, both top-8, renormalized) and token
counts from 1 to 8,192 it checks that both give the same expert ids and source rows and how far the weights
differ, then times each inside a CUDA graph of 100 calls, replayed alternately (vLLM's op, one pass, ...)
7 times: microseconds per call, the median and the range. Token counts above the patch's limit are timed too,
to show where the limit belongs; the "patched vLLM runs" column says which path serves each. Then the op's
contract on edge rows, each compared with vLLM's op: padding rows (VLLM_MOE_SKIP_PADDING), NaN and Inf
logits, many equal logits, float32 logits, no renormalization. Prints markdown tables, writes router_topk.json;
exits 1 if any expert id or source row differs or a weight (padding rows' aside) by more than 1e-6.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench.kernels.graph_timing import CALLS, REPS, alternate, graph_of

ROUTERS = {"qwen3-235b-tp8": (128, 8), "qwen3-coder-480b-tp8": (160, 8)}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def outputs(m: int, topk: int, device="cuda"):
    return (torch.empty(m, topk, device=device, dtype=torch.float32),
            torch.empty(m, topk, device=device, dtype=torch.int32),
            torch.empty(m, topk, device=device, dtype=torch.int32))


def compare(ops, router, logits, topk, renormalize=True, pad=None) -> dict:
    """One input through both: ids, source rows, weights, and what each wrote for padding rows."""
    w0, i0, s0 = outputs(logits.shape[0], topk)
    w1, i1, s1 = outputs(logits.shape[0], topk)
    ops.topk_softmax(w0, i0, s0, logits, renormalize, is_padding=pad)
    router._launch_one_pass_topk(w1, i1, s1, logits, renormalize, pad)
    # Padding rows: both write expert -1, and their weights are never read. vLLM's op writes no defined weight
    # there for expert counts on its two-kernel path (160): moeTopK excludes the experts it has picked by reading
    # back the ids it wrote, -1 on those rows, so it picks the first expert k times (run 8: 0.125 each).
    keep = slice(None) if pad is None else ~pad
    out = {"same_ids": bool(torch.equal(i0, i1)), "same_source_rows": bool(torch.equal(s0, s1)),
           "max_weight_diff": float((w0[keep] - w1[keep]).abs().max()),
           "weights_close": bool(torch.allclose(w0[keep], w1[keep], rtol=0, atol=1e-6))}
    if pad is not None:
        out["padding_rows"] = {"vllm_ids": sorted(set(i0[pad].flatten().tolist())),
                               "one_pass_ids": sorted(set(i1[pad].flatten().tolist()))}
    if not out["same_ids"]:  # what each wrote for the first row that differs
        r = int((i0 != i1).any(dim=1).nonzero()[0])
        out["first_differing_row"] = {"row": r, "vllm": [i0[r].tolist(), w0[r].tolist()],
                                      "one_pass": [i1[r].tolist(), w1[r].tolist()]}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.router import fused_topk_router as router

    def vllm_op(logits, w, i, s):
        ops.topk_softmax(w, i, s, logits, True)

    def one_pass(logits, w, i, s):  # the patch's kernel, also above the patch's own token limit
        router._launch_one_pass_topk(w, i, s, logits, True, None)

    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "calls_per_graph": CALLS, "reps": REPS, "cases": {},
               "contract": {}}
    rows = []
    for name, (experts, topk) in ROUTERS.items():
        for tokens in TOKENS:
            logits = (torch.randn(tokens, experts, device="cuda") * 2).to(torch.bfloat16)
            bufs = outputs(tokens, topk)
            served = "one pass" if router._use_one_pass_topk(bufs[0], bufs[1], logits, None) else "vLLM's op"
            same = compare(ops, router, logits, topk)
            graphs = {"vllm": graph_of(vllm_op, logits, *outputs(tokens, topk)),
                      "one_pass": graph_of(one_pass, logits, *outputs(tokens, topk))}
            timed = alternate(graphs, "vllm", "one_pass")
            t = timed["us"]
            case = {"experts": experts, "topk": topk, "tokens": tokens, "served_by": served, **same,
                    "us_vllm": t["vllm"], "us_one_pass": t["one_pass"], "ratio_median": timed["ratio_median"],
                    "ratio_range": timed["ratio_range"]}
            results["cases"][f"{name} {tokens} tok"] = case
            lo, hi = timed["ratio_range"]
            rows.append(f"| {name} | {experts} | {tokens} | {served} | {same['same_ids'] and same['same_source_rows']} "
                        f"| {same['max_weight_diff']:.1e} | {statistics.median(t['vllm']):.2f} | "
                        f"{statistics.median(t['one_pass']):.2f} | {timed['ratio_median']:.3f} ({lo:.3f}-{hi:.3f}) |")
    contract = results["contract"]
    for name, (experts, topk) in ROUTERS.items():
        logits = (torch.randn(8, experts, device="cuda") * 2).to(torch.bfloat16)
        pad = torch.tensor([False] * 5 + [True] * 3, device="cuda")
        contract[f"{name} padding rows"] = compare(ops, router, logits, topk, pad=pad)
        bad = logits.clone()
        bad[0, :] = float("nan")
        bad[1, 3], bad[2, 40], bad[3, 11] = float("inf"), float("nan"), float("-inf")
        contract[f"{name} NaN and Inf logits"] = compare(ops, router, bad, topk)
        ties = torch.randint(-2, 3, (8, experts), device="cuda").to(torch.bfloat16)
        contract[f"{name} equal logits"] = compare(ops, router, ties, topk)
        contract[f"{name} all logits equal"] = compare(ops, router, torch.zeros_like(logits), topk)
        contract[f"{name} float32 logits"] = compare(ops, router, torch.randn(8, experts, device="cuda") * 2, topk)
        contract[f"{name} not renormalized"] = compare(ops, router, logits, topk, renormalize=False)
    table = ["| router | experts | tokens | patched vLLM runs | same ids and source rows | max weight diff | "
             "vLLM op us/call | one pass us/call | one pass / vLLM (range) |",
             "|---|---|---|---|---|---|---|---|---|"] + rows
    table += ["", "| edge case | same ids | same source rows | max weight diff | padding rows' ids: vLLM / one pass |",
              "|---|---|---|---|---|"]
    for k, c in contract.items():
        padded = c.get("padding_rows")
        padded = f"{padded['vllm_ids']} / {padded['one_pass_ids']}" if padded else "-"
        table.append(f"| {k} | {c['same_ids']} | {c['same_source_rows']} | {c['max_weight_diff']:.1e} | {padded} |")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "router_topk.json").write_text(json.dumps(results, indent=1))
    (a.out / "router_topk.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    every = list(results["cases"].values()) + list(contract.values())
    return 0 if all(c["same_ids"] and c["same_source_rows"] and c["weights_close"] for c in every) else 1


if __name__ == "__main__":
    raise SystemExit(main())
