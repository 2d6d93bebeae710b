"""The engine bench's shard models: one GPU's share of a real FP8 MoE deployment as a serving.tiny_model checkpoint
(random weights, reduced depth, served at TP=1), and the bytes such a checkpoint takes on disk.

    python -m bench.e2e.shards --out DIR --preset qwen3-235b-a22b-tp8 --layers 4 --fp8 tensor [--reuse]

A preset gives the layer dimensions one GPU of a real deployment sees:
  - `-tp8` / `-tp4`: one rank of tensor parallelism 8 or 4 (heads, KV heads and every expert's N divided by the TP
    size; all experts, the model's top-k);
  - `-ep8`: one rank of expert parallelism 8, as vLLM's recipes deploy the block-FP8 Qwen3 and DeepSeek checkpoints
    (PRESETS says how it matches such a rank and where it does not);
  - `deepseek-v3-tp8-mla`: one rank of DeepSeek-V3 at tensor parallelism 8 in its own architecture (MLA, shared
    expert, dense first layers, grouped sigmoid routing) rather than Qwen3-MoE's.
The other flags are serving.tiny_model's and override the preset's values.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from serving import tiny_model
from serving.tiny_model import FP8_BLOCK, TinySpec

# One GPU's share of real models at tensor parallelism 8 ("TP8 shard"): attention heads and the
# MoE's N divided by 8 (KV heads replicated up to one per rank), hidden size and expert count
# whole, so each MoE GEMM has exactly the shape one rank runs. The vocabulary is cut (bench
# latency draws token ids up to about 10,000). DeepSeek-V3's MLA attention, shared expert, dense first
# layers and grouped sigmoid routing are stood in for by Qwen3-MoE's attention and softmax top-k: only
# its routed-expert GEMMs and o_proj are exact.
PRESETS: dict[str, dict] = {
    "qwen3-30b-a3b": dict(hidden=2048, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8,
                          moe_intermediate=768),
    "qwen3-235b-a22b-tp8": dict(hidden=4096, heads=8, kv_heads=1, head_dim=128, experts=128, top_k=8,
                                moe_intermediate=192),
    "qwen3-coder-480b-a35b-tp8": dict(hidden=6144, heads=12, kv_heads=1, head_dim=128, experts=160, top_k=8,
                                      moe_intermediate=320),
    "deepseek-v3-tp8": dict(hidden=7168, heads=16, kv_heads=1, head_dim=128, experts=256, top_k=8,
                            moe_intermediate=256),
    # Tensor parallelism 4 (vLLM's other layout for the block-FP8 Qwen3 checkpoints, whose N at TP8 is no
    # multiple of the 128 block): a quarter of the heads and of each expert's N, every expert.
    "qwen3-235b-a22b-tp4": dict(hidden=4096, heads=16, kv_heads=1, head_dim=128, experts=128, top_k=8,
                                moe_intermediate=384),
    "qwen3-coder-480b-a35b-tp4": dict(hidden=6144, heads=24, kv_heads=2, head_dim=128, experts=160, top_k=8,
                                      moe_intermediate=640),
    # Expert parallelism 8: a rank holds an eighth of the experts whole (N unsplit) and computes every token's
    # picks among them. Top-8 over 128 (160, 256) experts lands on average 8 x 16/128 = 1 (token, local expert)
    # pair per token on a rank, so the shard routes top-1 over its local experts: the same pairs per token, the
    # same expert weights read per step, the same MoE GEMM shapes (the config file E=16,N=1536 etc.). Where it
    # differs from a real rank: its router is 16 (20, 32) wide instead of 128 (160, 256), a step's pairs are
    # spread exactly one per token instead of 0-8 per token with the same mean, and a TP=1 run has none of EP's
    # collectives (the dispatch and combine of tokens across ranks). Attention as the layout shards it: TP8 heads
    # for the 235B (SageMaker recipe: TP8 with expert parallelism) and DeepSeek-V3 (Qwen3 attention in place of
    # MLA, as the tp8 preset), all heads for the Coder (recipe: data parallel 8 with expert parallelism).
    "qwen3-235b-a22b-ep8": dict(hidden=4096, heads=8, kv_heads=1, head_dim=128, experts=16, top_k=1,
                                moe_intermediate=1536),
    "qwen3-coder-480b-a35b-ep8": dict(hidden=6144, heads=96, kv_heads=8, head_dim=128, experts=20, top_k=1,
                                      moe_intermediate=2560),
    "deepseek-v3-ep8": dict(hidden=7168, heads=16, kv_heads=1, head_dim=128, experts=32, top_k=1,
                            moe_intermediate=2048),
    # DeepSeek-V3 at TP8 in its own architecture: an eighth of the 128 heads (MLA's low-rank projections q_a and
    # kv_a are whole on every rank), of every routed expert's N, of the shared expert and of the three dense first
    # layers' MLP (18,432 wide); all 256 experts, top-8 within 4 of 8 groups, sigmoid scores with a bias. Only TP's
    # collectives, the vocabulary and YaRN's scale differ from a rank of the real model.
    "deepseek-v3-tp8-mla": dict(arch="deepseek_v3", hidden=7168, heads=16, kv_heads=16, head_dim=128, q_lora_rank=1536,
                                kv_lora_rank=512, rope_head_dim=64, v_head_dim=128, experts=256, top_k=8,
                                moe_intermediate=256, shared_experts=1, dense_layers=3, dense_intermediate=2304,
                                expert_groups=8, topk_groups=4),
}
# Every preset: a vocabulary the bench's prompts fit, its context, and weights filled tensor by tensor (seconds
# instead of minutes for shard-sized models)
PRESET_COMMON = dict(vocab=16384, max_position=4096, direct_init=True)


def preset_spec(name: str, **overrides) -> TinySpec:
    if name not in PRESETS:
        raise ValueError(f"preset {name!r}: allowed {', '.join(PRESETS)}")
    return TinySpec(**{**PRESET_COMMON, **PRESETS[name], **overrides})


def check_tp(spec: TinySpec, tp: int) -> None:
    """Tensor parallel splits heads, KV heads, experts, experts' N and the vocab across ranks."""
    for name in ("heads", "kv_heads", "experts", "moe_intermediate", "vocab"):
        if getattr(spec, name) % tp:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(spec, name)} is not divisible by --tp-friendly={tp}")


def checkpoint_bytes(spec: TinySpec) -> int:
    """The bytes of the tensors that serving.tiny_model.make(spec) writes to model.safetensors (the file is these and
    a header of a few KB): bf16 for the router, norms and embeddings, and for an FP8 checkpoint one byte an element
    for each projection with its float32 scales (one a tensor, one per 128 x 128 block for block FP8, and an input
    scale for static). Every decoder layer after the dense first ones is the same, so a depth costs what the first
    MoE layer and one more give: no model of that depth is built."""
    first, at_first, layer = layer_bytes(spec)
    if spec.layers < first:
        return _tensor_bytes(spec)
    return at_first + (spec.layers - first) * layer


def layer_bytes(spec: TinySpec) -> tuple[int, int, int]:
    """(n, checkpoint_bytes of spec at n decoder layers, what each further layer adds): n counts the dense first
    layers and the first MoE layer."""
    first = spec.dense_layers + 1
    at_first, at_next = (_tensor_bytes(replace(spec, layers=n)) for n in (first, first + 1))
    return first, at_first, at_next - at_first


def _tensor_bytes(spec: TinySpec) -> int:
    return sum(tensor_bytes(spec, name, t) for name, t in tiny_model.tensor_shapes(spec).items())


def tensor_bytes(spec: TinySpec, name: str, t) -> int:
    """One tensor's bytes in the checkpoint (checkpoint_bytes' rule): bf16, or for an FP8 projection one byte an
    element with its float32 scales."""
    if not (spec.fp8 and tiny_model.is_projection(name, t)):
        return 2 * t.numel()
    if spec.fp8_scheme == "block":
        n, k = t.shape
        return t.numel() + 4 * -(-n // FP8_BLOCK) * -(-k // FP8_BLOCK)
    return t.numel() + 4 * (2 if spec.fp8_scheme == "static" else 1)


def parse(argv: list[str] | None = None):
    """The command line's options and the model they describe (a usage error exits, as argparse does)."""
    p = tiny_model.parser("python -m bench.e2e.shards", __doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="the layer dimensions of one GPU of a real model (the flags above override them)")
    p.add_argument("--max-position", type=int, default=None, metavar="N",
                   help="the checkpoint's max_position_embeddings (default: the preset's; a run's longer context)")
    p.add_argument("--tp-friendly", type=int, default=None, metavar="TP",
                   help="check that heads, KV heads, experts, N and vocab split evenly over TP ranks")
    a = p.parse_args(argv)
    given = tiny_model.given_fields(a)
    if a.max_position:
        given["max_position"] = a.max_position
    try:
        spec = preset_spec(a.preset, **given) if a.preset else TinySpec(**given)
        spec.check()
        if a.tp_friendly:
            check_tp(spec, a.tp_friendly)
    except ValueError as e:
        p.error(str(e))
    return a, spec


def main(argv: list[str] | None = None) -> int:
    return tiny_model.write(*parse(argv))


if __name__ == "__main__":
    sys.exit(main())
