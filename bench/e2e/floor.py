"""One decode step of a recorded profile window against its memory floor: per layer and per step, each role's
kernels, their GPU time, the bytes they must read from GPU memory (from the shard's shapes), and the time those
bytes take at the GPU's achievable bandwidth.

    python -m bench.e2e.floor --run bench/data/DIR --model MODEL --window ARM.cN [--gpu H200|H100] [--context N]

Rules:
- A window (e2e.json: models.MODEL.profile["ARM.cN"], traces.profile) gives the 40 largest kernels by time, the
  window's GPU time and its engine steps; every step counts as a decode step of c tokens (c from the window's name),
  its requests' prefill steps (1 in out tokens) included. GPU time outside the top 40 is a row of its own.
- A kernel's role comes from its name (ROLES, first match). A kernel of scope "either" or of no role is per step where it
  ran at most STEP_LAUNCHES times a step (the lm_head's bf16 GEMM, the final norm), per layer otherwise.
- The MoE GEMMs alternate w13 then w2 in every layer (traces.classify): their launches split in two halves, their
  time as the window's recorded moe_w13 and moe_w2 shares. qkv_proj and o_proj alternate on kernels whose summed
  times cannot be told apart, so they share one row.
- Bytes read: weights (FP8 one byte an element plus float32 scales, one per 128 x 128 block or one a tensor; router,
  norms, embeddings and lm_head bf16), activations of c tokens (bf16), and the attention's KV cache of c sequences
  at the context (default: the window's prompt plus half its output tokens). The MoE reads the distinct experts c
  tokens pick: E x (1 - (1 - top_k/E)^c) for top-k routing over E local experts, uniform.
- A role without a byte model (other, sampling, step bookkeeping) has no floor: its time is all above it.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

# Achievable (not nominal) read bandwidth of one GPU's memory, bytes/s: a floor is bytes at this rate.
BANDWIDTH = {"H200": 4.3e12, "H100": 3.0e12}
# A kernel launched at most this many times a step, in a role of scope "either" or in no role, is a per-step kernel
# (the output head, the final norm, the step's copies in and out); a layer's kernel runs once per layer and step.
STEP_LAUNCHES = 3
REMAINDER = "other kernels, not in the top 40"

# (role, scope, name pattern): the first match gives a kernel's role. Scope "layer": a kernel of every decoder layer;
# "step": once a step; "either": by its launches (STEP_LAUNCHES).
ROLES = (
    ("moe", "layer", re.compile(r"fused_moe_kernel|lmi_fused_moe_gemv")),
    ("qkv_proj + o_proj", "layer",
     re.compile(r"cutlass_3x_gemm_fp8_blockwise|_lmi_block_fp8_mm_small_m|_lmi_block_fp8_gemv|deep_gemm|"
                r"cutlass_scaled_mm|w8a8_block|sm90_fp8_gemm")),
    ("attention", "layer", re.compile(r"FlashAttnFwd|flash_fwd|prepare_varlen_num_blocks|fmha|paged_attention")),
    ("KV write", "layer", re.compile(r"reshape_and_cache|fused_rope_store|set_kv_buffer")),
    ("norms and quantization", "either",
     re.compile(r"rms_?norm|RMSNorm|per_token_group_quant|triton_red_fused|qknorm|scaled_fp8_quant|"
                r"dynamic_per_token", re.I)),
    ("top-k gating and routing", "layer",
     re.compile(r"topkGating|topk_softmax|moe_align_block_size|moe_sum|_router_triton_kernel")),
    ("activation", "layer", re.compile(r"act_and_mul|silu_and_mul|silu_kernel")),
    ("router GEMM", "either", re.compile(r"nvjet|ll_bf16|splitKreduce|cublas|gemm.*bf16|bf16.*gemm", re.I)),
    ("sampler, logits, lm_head", "step",
     re.compile(r"_gumbel_sample|_bias_kernel|ArgMax|_apply_write|sampl|logit|penalt", re.I)),
)
# What a per-layer role's GEMM becomes when it runs once a step: the output head.
STEP_ROLE = {"router GEMM": "sampler, logits, lm_head"}


@dataclass
class Row:
    scope: str  # "layer": figures per layer-step; "step": per step
    role: str
    kernels: list[str] = field(default_factory=list)
    launches: float = 0.0
    us: float = 0.0
    bytes: float = 0.0

    def floor_us(self, bandwidth: float) -> float:
        return self.bytes / bandwidth * 1e6


def short_name(name: str) -> str:
    """A kernel's name without its template arguments, signature and namespaces; a CUTLASS or FlashAttention
    wrapper (device_kernel<...>, enable_sm90_or_later<...>) gives the name it wraps."""
    s = name.removeprefix("void ")
    for wrapper in ("cutlass::device_kernel<", "flash::enable_sm90_or_later<"):
        if s.startswith(wrapper):
            s = s[len(wrapper):]
    s = re.split(r"[<(]", s, maxsplit=1)[0]
    return s.rsplit("::", 1)[-1].strip() or name[:40]


def role_of(name: str, launches: int, steps: int) -> tuple[str, str]:
    """(scope, role) of a kernel by its name and launches (ROLES)."""
    for role, scope, rx in ROLES:
        if rx.search(name):
            if scope == "either":
                scope = "step" if launches <= STEP_LAUNCHES * steps else "layer"
            return scope, STEP_ROLE.get(role, role) if scope == "step" else role
    return ("step" if launches <= STEP_LAUNCHES * steps else "layer"), "other"


def expected_experts(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts that `tokens` tokens touch, each picking top_k of `experts` uniformly."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


@functools.lru_cache(maxsize=None)
def layer_weights(spec) -> dict[str, float]:
    """Weight bytes of one MoE decoder layer by part: qkv (every attention projection but o_proj), o_proj, one
    expert's w13 and w2, shared experts, router, norms; and per step: lm_head and one embedding row."""
    from serving import tiny_model

    from .shards import tensor_bytes

    first = spec.dense_layers  # the first MoE layer
    parts = dict.fromkeys(("qkv", "o_proj", "w13", "w2", "shared", "router", "norms", "lm_head", "embed_row"), 0.0)
    prefix = f"model.layers.{first}."
    for name, t in tiny_model.tensor_shapes(replace(spec, layers=first + 1)).items():
        b = tensor_bytes(spec, name, t)
        if name == "lm_head.weight":
            parts["lm_head"] = b
        elif name == "model.embed_tokens.weight":
            parts["embed_row"] = b / t.shape[0]
        elif not name.startswith(prefix):
            continue
        elif ".shared_expert" in name:
            parts["shared"] += b
        elif ".mlp.experts." in name:
            parts["w2" if "down_proj" in name else "w13"] += b / spec.experts
        elif name.endswith("mlp.gate.weight"):
            parts["router"] += b
        elif "self_attn." in name and name.endswith("o_proj.weight"):
            parts["o_proj"] += b
        elif "self_attn." in name and "_proj" in name:
            parts["qkv"] += b
        elif "norm" in name:
            parts["norms"] += b
    return parts


def role_bytes(spec, w: dict[str, float], c: int, context: int) -> dict[tuple[str, str], float]:
    """Bytes read per layer-step (scope "layer") or per step ("step") by role, at c tokens and the context."""
    act = c * spec.hidden * 2  # one bf16 activation row per token
    touched = expected_experts(spec.experts, spec.top_k, c)
    kv_row = spec.kv_heads * spec.head_dim * 2 * 2  # K and V, bf16, one token of one layer
    return {
        ("layer", "moe_w13"): touched * w["w13"] + w["shared"] / 2 + act,
        ("layer", "moe_w2"): touched * w["w2"] + w["shared"] / 2 + c * spec.top_k * spec.moe_intermediate * 2,
        ("layer", "qkv_proj + o_proj"): w["qkv"] + w["o_proj"] + act + c * spec.heads * spec.head_dim * 2,
        ("layer", "attention"): c * context * kv_row + c * spec.heads * spec.head_dim * 2,
        ("layer", "KV write"): c * kv_row,
        ("layer", "norms and quantization"): w["norms"] + 2 * act,
        ("layer", "top-k gating and routing"): c * spec.experts * 2,
        ("layer", "activation"): c * spec.top_k * 2 * spec.moe_intermediate * 2,
        ("layer", "router GEMM"): w["router"] + act,
        ("step", "norms and quantization"): spec.hidden * 2 + act,
        ("step", "sampler, logits, lm_head"): w["lm_head"] + act,
        ("step", "other"): c * w["embed_row"],
    }


def _model_spec(name: str, layers: int):
    from bench.e2e.models import MODELS

    base = name.split("@", 1)[0]
    found = [m for m in MODELS if m.name == base]
    if not found:
        raise ValueError(f"model {name!r}: no bench model {base!r} (bench/e2e/models.py)")
    m = found[0]
    from bench.e2e.shards import preset_spec

    return preset_spec(m.preset, layers=layers, fp8=True, fp8_scheme=m.fp8)


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def window_profile(results: dict, model: str, window: str) -> dict:
    """The recorded profile window, or a ValueError naming the models and windows there are."""
    models = results.get("models", {})
    if model not in models:
        raise ValueError(f"model {model!r}: not in the run; models: {', '.join(sorted(models)) or 'none'}")
    prof = models[model].get("profile") or {}
    if window not in prof:
        raise ValueError(f"window {window!r}: not in {model}'s profile; windows: {', '.join(sorted(prof)) or 'none'}")
    p = prof[window]
    missing = [k for k in ("top_kernels", "steps", "total_gpu_ms") if k not in p]
    if missing:
        raise ValueError(f"window {window!r} of {model}: recorded without {', '.join(missing)} (an older bench)")
    return p


def floor_data(results: dict, model: str, window: str, gpu: str, context: int | None = None,
               bandwidth: float | None = None) -> dict:
    """The table's rows (Row, figures per layer-step or per step) and the step's totals."""
    from bench.e2e.models import DEFAULT_LAYERS

    p = window_profile(results, model, window)
    m = re.fullmatch(r"(.+)\.c(\d+)", window)
    if not m:
        raise ValueError(f"window {window!r}: not ARM.cN")
    c = int(m.group(2))
    suffix = re.search(r"@(\d+)L$", model)
    layers = _int(results["models"][model].get("layers")) or (int(suffix.group(1)) if suffix else DEFAULT_LAYERS)
    if bandwidth is None:
        if gpu not in BANDWIDTH:
            raise ValueError(f"gpu {gpu!r}: known {', '.join(BANDWIDTH)} (or give the bandwidth)")
        bandwidth = BANDWIDTH[gpu]
    args = results.get("args", {})
    out = _int(args.get("profile_tokens")) or _int(args.get("out_tokens")) or 1
    if context is None:
        context = (_int(args.get("in_tokens")) or 0) + out // 2
    spec = _model_spec(model, layers)
    steps = p["steps"]
    rows: dict[tuple[str, str], Row] = {}
    moe_launches = moe_us = 0.0
    moe_names: list[str] = []
    for name, launches, total_us in p["top_kernels"]:
        scope, role = role_of(name, launches, steps)
        if role == "moe":
            moe_launches += launches
            moe_us += total_us
            moe_names += [short_name(name)] if short_name(name) not in moe_names else []
            continue
        row = rows.setdefault((scope, role), Row(scope, role))
        row.launches += launches
        row.us += total_us
        if short_name(name) not in row.kernels:
            row.kernels.append(short_name(name))
    share = p.get("share", {})
    w13, w2 = share.get("moe_w13", 0.0), share.get("moe_w2", 0.0)
    frac13 = w13 / (w13 + w2) if w13 + w2 else math.ceil(moe_launches / 2) / max(moe_launches, 1)
    moe = [Row("layer", "moe_w13", moe_names, math.ceil(moe_launches / 2), moe_us * frac13),
           Row("layer", "moe_w2", moe_names, moe_launches // 2, moe_us * (1 - frac13))]
    top_us = sum(k[2] for k in p["top_kernels"])
    rest = Row("step", REMAINDER, [], 0, max(0.0, p["total_gpu_ms"] * 1e3 - top_us))
    by_role = role_bytes(spec, layer_weights(spec), c, context)
    order = [r for r, _, _ in ROLES if r != "moe"] + ["sampler, logits, lm_head", "other"]
    ordered = moe + sorted(rows.values(), key=lambda r: (r.scope != "layer", order.index(r.role))) + [rest]
    for r in ordered:
        per = steps * (layers if r.scope == "layer" else 1)
        r.launches /= per
        r.us /= per
        r.bytes = by_role.get((r.scope, r.role), 0.0)
    step_us = p["total_gpu_ms"] * 1e3 / steps
    floor = sum(r.floor_us(bandwidth) * (layers if r.scope == "layer" else 1) for r in ordered)
    return {"rows": ordered, "c": c, "layers": layers, "steps": steps, "context": context, "out_tokens": out,
            "gpu": gpu, "bandwidth": bandwidth, "step_us": step_us, "floor_us": floor,
            "other": sorted({k for r in ordered if r.role == "other" for k in r.kernels}),
            "busy": (p.get("gpu_busy_ms"), p.get("gpu_span_ms"))}


def floor_table(results: dict, model: str, window: str, gpu: str, context: int | None = None) -> str:
    """floor_data as a markdown table with its caption and totals."""
    d = floor_data(results, model, window, gpu, context)
    bw = d["bandwidth"]
    lines = [f"{model} {window} on {gpu}: one step = {d['c']} sequences decoding one token each at context "
             f"{d['context']}; the window's {d['steps']} engine steps count as decode steps (its requests' prefill "
             f"is 1 step in {d['out_tokens']}); floor = bytes read / {bw / 1e12:.1f} TB/s ({gpu}'s achievable, not "
             f"nominal, bandwidth); {d['layers']} layers.", "",
             "| scope | role | kernels | launches | µs | bytes (MB) | floor µs | share of floor |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        f = r.floor_us(bw)
        scope = "per layer-step" if r.scope == "layer" else "per step"
        lines.append(f"| {scope} | {r.role} | {', '.join(r.kernels) or '—'} | {r.launches:.2f} | {r.us:.2f} | "
                     f"{r.bytes / 1e6:.3f} | {f:.2f} | {f'{f / r.us:.0%}' if r.bytes and r.us else '—'} |")
    lines += ["", f"per step: {d['step_us']:.1f} µs of GPU time; floor {d['floor_us']:.1f} µs (all {d['layers']} "
                  f"layers plus the per-step kernels); the step at {d['floor_us'] / d['step_us']:.0%} of its floor"]
    busy, span = d["busy"]
    if busy is not None and span:
        lines.append(f"GPU busy {busy:.1f} ms of a {span:.1f} ms span ({busy / span:.0%})")
    if d["other"]:
        lines.append(f"kernels in role other: {', '.join(d['other'])}")
    return "\n".join(lines)


def run_gpu(run: Path) -> str | None:
    """The GPU a run's README.md names on its first line ("one H200"), or None."""
    readme = run / "README.md"
    if readme.exists():
        m = re.search(r"\bone (H[12]00)\b", readme.read_text().split("\n", 1)[0])
        return m.group(1) if m else None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m bench.e2e.floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a run's folder (its e2e.json and README.md)")
    p.add_argument("--model", required=True)
    p.add_argument("--window", required=True, help="ARM.cN, a profile window of the model")
    p.add_argument("--gpu", choices=sorted(BANDWIDTH), default=None, help="default: the run's README.md")
    p.add_argument("--context", type=int, default=None, help="tokens of context each sequence attends to")
    a = p.parse_args(argv)
    gpu = a.gpu or run_gpu(a.run)
    if not gpu:
        p.error(f"no GPU named on {a.run / 'README.md'}'s first line: give --gpu")
    results = json.loads((a.run / "e2e.json").read_text())
    try:
        print(floor_table(results, a.model, a.window, gpu, a.context))
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
