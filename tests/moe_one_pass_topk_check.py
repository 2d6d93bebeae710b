"""Run patch 0007's one-pass softmax top-k routing kernel under Triton's interpreter.

Run by path with TRITON_INTERPRET=1 in the environment (Triton reads it at import, so a separate process);
prints one JSON object: case -> what was compared. The kernel and its launcher are the installed vLLM's own
(vllm/model_executor/layers/fused_moe/router/fused_topk_router.py), taken from that file by name and run with
Triton itself (vLLM's CPU build puts a stand-in for Triton in its own modules). The reference is the contract
of vLLM 0.32's topk_softmax op (csrc/moe/topk_softmax_kernels.cu) written in torch: softmax in float32, a NaN
or Inf probability as 0, the top-k with ties to the lower expert, weights scaled by the reciprocal of the picks'
sum (1 when it is 0) when renormalized, padding rows as expert -1 (weights as computed), source rows
k * num_rows + row.
bench/kernels/router_topk.py compares the kernel with vLLM's CUDA op itself on the H200.
"""
from __future__ import annotations

import json
import os

import torch

from check_script import patched_definitions  # this script's folder comes first on its path

NAMES = ("LMI_MOE_ONE_PASS_TOPK_ENV", "_ONE_PASS_TOPK_MAX_TOKENS", "_ONE_PASS_TOPK_MAX_EXPERTS",
         "_lmi_one_pass_topk_enabled", "_topk_softmax_one_pass_kernel", "_launch_one_pass_topk")

router = patched_definitions("model_executor/layers/fused_moe/router/fused_topk_router.py", NAMES, "0007",
                             "one_pass_topk")


def reference(logits: torch.Tensor, topk: int, renormalize: bool, pad: torch.Tensor | None):
    x = logits.float()
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    p = e * (1.0 / e.sum(dim=-1, keepdim=True))
    finite = torch.isfinite(p)  # a NaN or +Inf logit makes its whole row NaN
    p = torch.where(finite, p, torch.zeros_like(p))
    # softmax is monotonic: order by the logits (a row of NaN: all equal), ties (stable sort) to the lower expert
    order = torch.where(finite, x, torch.full_like(x, float("-inf")))
    ids = torch.sort(order, dim=-1, descending=True, stable=True).indices[:, :topk]
    w = torch.gather(p, 1, ids)
    if renormalize:
        picked = torch.zeros_like(w[:, 0])
        for k in range(topk):  # in pick order, as the op sums
            picked = picked + w[:, k]
        w = w * (1.0 / torch.where(picked > 0, picked, torch.ones_like(picked)))[:, None]
    ids = ids.to(torch.int32)
    if pad is not None:
        ids = torch.where(pad[:, None], torch.full_like(ids, -1), ids)
    m = logits.shape[0]
    src = (torch.arange(topk)[None, :] * m + torch.arange(m)[:, None]).to(torch.int32)
    return w, ids, src


def run(logits, topk, renormalize, pad, ids_dtype=torch.int32):
    m = logits.shape[0]
    w = torch.empty(m, topk, dtype=torch.float32)
    ids = torch.empty(m, topk, dtype=ids_dtype)
    src = torch.empty(m, topk, dtype=torch.int32)
    router._launch_one_pass_topk(w, ids, src, logits, renormalize, pad)
    return w, ids, src


def compare(logits, topk, renormalize, pad=None, ids_dtype=torch.int32) -> dict:
    w, ids, src = run(logits, topk, renormalize, pad, ids_dtype)
    rw, rids, rsrc = reference(logits, topk, renormalize, pad)
    return {"ids_equal": bool(torch.equal(ids.to(torch.int32), rids)), "src_equal": bool(torch.equal(src, rsrc)),
            "max_weight_diff": float((w - rw).abs().max()), "ids_dtype": str(ids.dtype),
            "first_ids": ids[0].tolist(), "first_weights_sum": float(w[0].sum())}


def main() -> None:
    g = torch.Generator().manual_seed(0)
    cases = {}
    # the TP8 shards' routers (Qwen3-235B: 128 experts, Qwen3-Coder: 160, both top-8, renormalized), a
    # Mixtral-like 8 experts top-2, and an expert count that is neither a power of two nor a multiple of 64
    for experts, topk in ((128, 8), (160, 8), (8, 2), (60, 4)):
        for rows in (1, 5, 33):
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                logits = (torch.randn(rows, experts, generator=g) * 2).to(dtype)
                cases[f"E{experts} k{topk} rows{rows} {dtype}"] = compare(logits, topk, True)
        logits = torch.randn(3, experts, generator=g).to(torch.bfloat16)
        cases[f"E{experts} k{topk} not renormalized"] = compare(logits, topk, False)
        cases[f"E{experts} k{topk} int64 ids"] = compare(logits, topk, True, ids_dtype=torch.int64)
    # many equal logits: the lower expert wins every tie
    ties = torch.randint(-2, 3, (4, 160), generator=g).to(torch.bfloat16)
    cases["ties E160"] = compare(ties, 8, True)
    cases["all equal E128"] = compare(torch.zeros(2, 128, dtype=torch.bfloat16), 8, True)
    # a NaN or +Inf logit zeroes its row: experts 0..k-1, weight 0 (a padding row's degenerate hidden state must
    # not pick one expert 8 times); a -Inf logit is an expert of probability 0
    bad = torch.randn(4, 128, generator=g).to(torch.bfloat16)
    bad[0, :] = float("nan")
    bad[1, 5] = float("inf")
    bad[2, 17] = float("nan")
    bad[3, 9] = float("-inf")
    bad[3, 100:] = float("-inf")
    cases["nan and inf"] = compare(bad, 8, True)
    w, ids, _ = run(bad, 8, True, None)
    cases["nan and inf rows"] = {"ids": ids.tolist(), "weights": w.tolist()}
    # cudagraph padding rows (VLLM_MOE_SKIP_PADDING): expert -1, weights as computed
    logits = torch.randn(6, 128, generator=g).to(torch.bfloat16)
    pad = torch.tensor([False, False, False, True, True, True])
    cases["padding rows"] = compare(logits, 8, True, pad)
    w, ids, _ = run(logits, 8, True, pad)
    unpadded, _, _ = run(logits, 8, True, None)
    cases["padding rows values"] = {"ids": sorted(set(ids[3:].flatten().tolist())),
                                    "weights_kept": bool(torch.equal(w, unpadded))}
    cases["limits"] = {"tokens": router._ONE_PASS_TOPK_MAX_TOKENS, "experts": router._ONE_PASS_TOPK_MAX_EXPERTS}
    for value in ("", "1", "on", "0", "off", "maybe"):
        os.environ[router.LMI_MOE_ONE_PASS_TOPK_ENV] = value
        router._lmi_one_pass_topk_enabled.cache_clear()
        try:
            cases[f"switch {value!r}"] = router._lmi_one_pass_topk_enabled()
        except ValueError as e:
            cases[f"switch {value!r}"] = str(e)
    print(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
