"""Make a tiny random-weight Qwen3-MoE (or DeepSeek-V3) checkpoint, with no hub download.

The launcher serves one of these when no model is configured (`make run`; the image makes it at
build time), the tests serve one on the CPU engine, and `--fp8` writes an FP8 checkpoint for the
GPU smoke tests. The engine benchmark's shard-sized models are this module's too (bench/e2e/shards.py).

    python -m serving.tiny_model --out DIR [--layers 2] [--hidden 256] [--experts 8] [--fp8 [tensor|static|block]]
    python -m serving.tiny_model --out DIR ... --reuse   # keep DIR when it already holds that model

The tokenizer is byte-level (every byte is a token, no merges), so any text
round-trips and no vocabulary file has to be downloaded.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen models use; ends the assistant turn with <|im_end|> (the EOS).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Bumped whenever the files this module writes change, so cached models are rebuilt.
FORMAT_VERSION = 2
# How FP8 checkpoints are quantized (vLLM's Fp8Config):
#   tensor: one weight scale per tensor, activations scaled per tensor at run time (dynamic);
#   static: as tensor, plus a calibrated input_scale per projection (activation_scheme static),
#           the only per-tensor form FlashInfer CUTLASS MoE accepts;
#   block:  128x128 weight blocks (weight_scale_inv), dynamic activations: Qwen's and DeepSeek's
#           official FP8 checkpoints.
FP8_SCHEMES = ("tensor", "static", "block")
FP8_BLOCK = 128
# The architectures make() writes: config.json's model_type -> the transformers class whose state dict names and
# shapes the checkpoint's tensors (vLLM loads both)
ARCHS = {"qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
# The input_scale written for static checkpoints: random activations here stay well inside
# 0.05 * 448 (float8_e4m3fn's largest value).
STATIC_INPUT_SCALE = 0.05


@dataclass(frozen=True)
class TinySpec:
    layers: int = 2
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 32
    experts: int = 8
    top_k: int = 2
    moe_intermediate: int = 256
    vocab: int = 512
    max_position: int = 2048
    seed: int = 0
    fp8: bool = False
    fp8_scheme: str = "tensor"
    # "deepseek_v3": DeepSeek-V3's architecture, with the fields below; head_dim is then the part of a query and key
    # head without RoPE (qk_nope_head_dim), kv_heads is unused (MLA caches one latent a token)
    arch: str = "qwen3_moe"
    q_lora_rank: int = 0  # MLA: the query's low-rank width,
    kv_lora_rank: int = 0  # the cached latent's width,
    rope_head_dim: int = 0  # a head's RoPE part (one per token, shared by the heads),
    v_head_dim: int = 0  # and a value head
    shared_experts: int = 0  # experts every token runs (moe_intermediate wide each)
    dense_layers: int = 0  # the first layers, a dense MLP of dense_intermediate instead of the MoE
    dense_intermediate: int = 0
    expert_groups: int = 1  # grouped top-k: the experts in expert_groups groups, tokens routed within topk_groups
    topk_groups: int = 1
    # Fill weights tensor by tensor (on the GPU when there is one) instead of through a
    # transformers model: seconds instead of minutes for shard-sized models. Other random
    # values than the transformers path, so off for the embedded model.
    direct_init: bool = False

    def check(self) -> None:
        if self.vocab < 256 + len(SPECIAL_TOKENS):
            raise ValueError(f"vocab must be at least {256 + len(SPECIAL_TOKENS)} (256 bytes + special tokens)")
        if self.top_k > self.experts:
            raise ValueError("top_k must not exceed experts")
        if self.heads % self.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        if self.fp8_scheme not in FP8_SCHEMES:
            raise ValueError(f"fp8 scheme {self.fp8_scheme!r}: allowed {', '.join(FP8_SCHEMES)}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch {self.arch!r}: allowed {', '.join(ARCHS)}")
        if self.arch == "deepseek_v3":
            if min(self.q_lora_rank, self.kv_lora_rank, self.rope_head_dim, self.v_head_dim) <= 0:
                raise ValueError("deepseek_v3 needs q_lora_rank, kv_lora_rank, rope_head_dim and v_head_dim")
            if self.experts % self.expert_groups or self.topk_groups > self.expert_groups:
                raise ValueError("expert_groups must divide experts and be at least topk_groups")
            if self.dense_layers and self.dense_intermediate <= 0:
                raise ValueError("dense_layers needs dense_intermediate")
        if self.fp8 and self.fp8_scheme == "block" and self.moe_intermediate % FP8_BLOCK:
            # vLLM refuses it too (validate_fp8_block_shape_moe): block-FP8 MoE needs N % 128 == 0.
            raise ValueError(f"block FP8 needs moe_intermediate divisible by {FP8_BLOCK} "
                             f"(got {self.moe_intermediate})")


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    # Order by the byte each stand-in represents, so token id == byte value.
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character map (what ByteLevel uses).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _config(spec: TinySpec, eos_id: int, bos_id: int) -> dict:
    if spec.arch == "deepseek_v3":
        return _deepseek_config(spec, eos_id, bos_id)
    cfg = {
        "architectures": [ARCHS[spec.arch]],
        "model_type": spec.arch,
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.moe_intermediate * 2,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "num_experts": spec.experts,
        "num_experts_per_tok": spec.top_k,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        **_common_config(spec, eos_id, bos_id, rope_theta=1000000.0),
    }
    return _with_quantization(cfg, spec)


def _deepseek_config(spec: TinySpec, eos_id: int, bos_id: int) -> dict:
    """DeepSeek-V3's config.json keys as its checkpoint gives them (vLLM's DeepseekV3ForCausalLM reads the router's
    topk_method and scoring_func from here; transformers keeps them as attributes). RoPE without YaRN scaling: the
    shard's 4,096 positions are YaRN's original context, where it changes the attention's scale only."""
    cfg = {
        "architectures": [ARCHS[spec.arch]],
        "model_type": spec.arch,
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.dense_intermediate or spec.moe_intermediate,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_nope_head_dim": spec.head_dim,
        "qk_rope_head_dim": spec.rope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "n_routed_experts": spec.experts,
        "n_shared_experts": spec.shared_experts,
        "num_experts_per_tok": spec.top_k,
        "n_group": spec.expert_groups,
        "topk_group": spec.topk_groups,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "first_k_dense_replace": spec.dense_layers,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 0,
        **_common_config(spec, eos_id, bos_id, rope_theta=10000.0),
    }
    return _with_quantization(cfg, spec)


def _common_config(spec: TinySpec, eos_id: int, bos_id: int, rope_theta: float) -> dict:
    """The config.json keys both architectures write alike (after their own)."""
    return {
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def _with_quantization(cfg: dict, spec: TinySpec) -> dict:
    if spec.fp8:
        # vLLM's Fp8Config: serialized float8_e4m3fn weights (see FP8_SCHEMES).
        cfg["quantization_config"] = {
            "quant_method": "fp8",
            "activation_scheme": "static" if spec.fp8_scheme == "static" else "dynamic",
            "ignored_layers": ["lm_head"] + [f"model.layers.{i}.mlp.gate"
                                             for i in range(spec.dense_layers, spec.layers)],  # the MoE layers' routers
        }
        if spec.fp8_scheme == "block":
            cfg["quantization_config"]["weight_block_size"] = [FP8_BLOCK, FP8_BLOCK]
    return cfg


def _quantize_fp8(state: dict, scheme: str = "tensor") -> dict:
    """FP8 for every projection (attention and experts); router, norms, embeddings stay bf16."""
    out = {}
    for name, t in state.items():
        if is_projection(name, t):
            out.update(_quantize_one(name, t, scheme))
        else:
            out[name] = t
    return out


def is_projection(name: str, t) -> bool:
    """The linear layers FP8 quantizes: attention, MLP and expert projections (not router, norms, embeddings)."""
    return name.endswith(("_proj.weight", "_proj_with_mqa.weight")) and t.dim() == 2


def _quantize_one(name: str, t, scheme: str) -> dict:
    import torch

    fmax = torch.finfo(torch.float8_e4m3fn).max
    w = t.float()
    base = name[: -len("weight")]
    if scheme == "block":
        n, k = w.shape
        b = FP8_BLOCK
        pad = torch.zeros(-(-n // b) * b, -(-k // b) * b, device=w.device)
        pad[:n, :k] = w
        blocks = pad.reshape(pad.shape[0] // b, b, pad.shape[1] // b, b)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / fmax
        q = (blocks / scale[:, None, :, None]).reshape(pad.shape)[:n, :k]
        return {name: q.clamp(-fmax, fmax).to(torch.float8_e4m3fn), base + "weight_scale_inv": scale}
    scale = (w.abs().max().clamp(min=1e-12) / fmax).reshape(())
    out = {name: (w / scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn), base + "weight_scale": scale}
    if scheme == "static":
        out[base + "input_scale"] = torch.tensor(STATIC_INPUT_SCALE, dtype=torch.float32, device=w.device)
    return out


def make(out: Path, spec: TinySpec) -> Path:
    """Write the model into `out` (atomically: a half-written folder is never left behind)."""
    import torch
    from safetensors.torch import save_file

    spec.check()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    tmp.chmod(0o755)  # readable by the image's non-root user when made at build time
    try:
        tok = _byte_level_tokenizer()
        tok.save(str(tmp / "tokenizer.json"))
        ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
        eos = ids["<|im_end|>"]
        (tmp / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "model_max_length": spec.max_position,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
        }, indent=2))
        (tmp / "special_tokens_map.json").write_text(json.dumps(
            {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2))
        cfg = _config(spec, eos_id=eos, bos_id=ids["<|endoftext|>"])
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"], "do_sample": False}, indent=2))

        torch.manual_seed(spec.seed)
        hf_cfg = _hf_config(cfg)
        if spec.direct_init:
            state = _direct_state(hf_cfg, spec)
        else:
            model = _model_class(spec.arch)(hf_cfg)
            _printable_output_head(model.lm_head.weight)
            model = model.to(torch.bfloat16)
            # transformers 5 may store experts fused; vLLM loads either layout, but we
            # write the classic per-expert names that every loader understands.
            state = _per_expert_state(model.state_dict(), spec)
            if spec.fp8:
                state = _quantize_fp8(state, spec.fp8_scheme)
        save_file({k: v.contiguous().cpu() for k, v in state.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        (tmp / "tiny_model.json").write_text(json.dumps({"format_version": FORMAT_VERSION, **asdict(spec)}, indent=2))
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _hf_config(cfg: dict):
    """The transformers config of a checkpoint's config.json (_config)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("architectures", "quantization_config")})


def _model_class(model_type: str):
    import transformers

    return getattr(transformers, ARCHS[model_type])


def _meta_state(hf_cfg, spec: TinySpec) -> dict:
    """The checkpoint's bf16 tensors before quantization, named and shaped as the transformers model's, on the meta
    device (no memory)."""
    import torch

    with torch.device("meta"):
        return _per_expert_state(_model_class(hf_cfg.model_type)(hf_cfg).state_dict(), spec)


def tensor_shapes(spec: TinySpec) -> dict:
    """The tensors of spec's checkpoint before FP8 quantization, by name, on the meta device (shapes, no memory)."""
    return _meta_state(_hf_config(_config(spec, eos_id=0, bos_id=0)), spec)


def _direct_state(hf_cfg, spec: TinySpec) -> dict:
    """Random weights named and shaped as the transformers model's (read on the meta device),
    drawn tensor by tensor and quantized at once, so peak memory stays near the checkpoint's size."""
    import torch

    shapes = _meta_state(hf_cfg, spec)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(spec.seed)
    std = hf_cfg.initializer_range
    out = {}
    for name, meta in shapes.items():
        if name.endswith("norm.weight"):
            t = torch.ones(meta.shape, dtype=torch.bfloat16, device=dev)
        elif name.endswith("e_score_correction_bias"):  # the router's bias: none, as in a model that never rebalanced
            t = torch.zeros(meta.shape, dtype=torch.bfloat16, device=dev)
        else:
            t = torch.empty(meta.shape, dtype=torch.float32, device=dev).normal_(0, std, generator=gen)
            if name == "lm_head.weight":
                _printable_output_head(t)
            t = t.to(torch.bfloat16)
        if spec.fp8 and is_projection(name, t):
            out.update(_quantize_one(name, t, spec.fp8_scheme))
        else:
            out[name] = t
    return out


def _printable_output_head(w) -> None:
    """Make answers readable: only printable ASCII can win the argmax.

    Rows of the output head for other ids (control bytes, non-ASCII bytes that
    would decode to replacement characters, special tokens, unused ids) are
    zeroed so their logit is exactly 0, while printable rows are scaled up; a
    random model then writes text that round-trips through any client.
    """
    import torch

    keep = torch.zeros(w.shape[0], dtype=torch.bool, device=w.device)
    keep[32:127] = True
    with torch.no_grad():
        w[~keep] = 0
        w[keep] *= 8


def _per_expert_state(state: dict, spec: TinySpec) -> dict:
    """Split fused expert tensors (transformers 5 layout) into mlp.experts.<i>.<proj>.weight."""
    out = {}
    for name, t in state.items():
        if ".mlp.experts." in name and t.dim() == 3:
            prefix = name.split(".mlp.experts.")[0] + ".mlp.experts"
            leaf = name.split(".mlp.experts.")[1]
            for e in range(t.shape[0]):
                if leaf.startswith("gate_up_proj"):
                    # [E, 2*I, H]: first half gate, second half up.
                    g, u = t[e].chunk(2, dim=0)
                    out[f"{prefix}.{e}.gate_proj.weight"] = g.clone()
                    out[f"{prefix}.{e}.up_proj.weight"] = u.clone()
                elif leaf.startswith("down_proj"):
                    out[f"{prefix}.{e}.down_proj.weight"] = t[e].clone()
                else:
                    raise RuntimeError(f"unexpected fused expert tensor {name}")
        else:
            out[name] = t
    return out


def holds(out: Path, spec: TinySpec) -> bool:
    """Whether `out` already holds the model of `spec` (its tiny_model.json, which make writes last)."""
    marker = Path(out) / "tiny_model.json"
    try:
        return json.loads(marker.read_text()) == {"format_version": FORMAT_VERSION, **asdict(spec)}
    except (OSError, ValueError):
        return False


def ensure(out: Path, spec: TinySpec = TinySpec()) -> Path:
    """Return `out`, making the model there first unless an identical one is already present."""
    return Path(out) if holds(out, spec) else make(Path(out), spec)


MODEL_FOLDER = "tiny-qwen3-moe"  # inside the cache directory


def default_model_dir(env: Mapping[str, str] = os.environ) -> Path:
    from .resolve import cache_dir
    return cache_dir(env) / MODEL_FOLDER


DIMENSIONS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "top_k", "moe_intermediate", "vocab",
              "seed")


def parser(prog: str = "python -m serving.tiny_model", description: str = __doc__.split("\n\n")[0]):
    """The command line: the output folder, the dimensions, the FP8 scheme, --reuse."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default: {default_model_dir()})")
    for name in DIMENSIONS:  # default None: "not given", so a caller's base values stand
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"default {getattr(TinySpec(), name)}")
    p.add_argument("--fp8", nargs="?", const="tensor", default=None, choices=FP8_SCHEMES,
                   help="write an FP8 (float8_e4m3fn) checkpoint: tensor (default), static or block")
    p.add_argument("--direct-init", action="store_true", help="fill weights tensor by tensor (fast)")
    p.add_argument("--reuse", action="store_true",
                   help="leave the output folder as it is when it already holds this model (its tiny_model.json)")
    return p


def given_fields(a: argparse.Namespace) -> dict:
    """The TinySpec fields the parsed command line gives."""
    given = {k: getattr(a, k) for k in DIMENSIONS if getattr(a, k) is not None}
    if a.fp8:
        given.update(fp8=True, fp8_scheme=a.fp8)
    if a.direct_init:
        given["direct_init"] = True
    return given


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, TinySpec]:
    """The command line's options and the model they describe (a usage error exits, as argparse does)."""
    p = parser()
    a = p.parse_args(argv)
    try:
        spec = TinySpec(**given_fields(a))
        spec.check()
    except ValueError as e:
        p.error(str(e))
    return a, spec


def write(a: argparse.Namespace, spec: TinySpec) -> int:
    """Make (or with --reuse, keep) the model the command line describes; print its folder."""
    out = (ensure if a.reuse else make)(a.out or default_model_dir(), spec)
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    return write(*parse(argv))


if __name__ == "__main__":
    sys.exit(main())
