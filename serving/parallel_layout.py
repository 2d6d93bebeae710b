"""The parallel layout, chosen from the checkpoint's config.json and the GPU count before any weight is read.

A block-FP8 checkpoint keeps one weight scale per 128x128 block (`weight_block_size`). Tensor parallelism splits
each expert's gate/up rows (N, `moe_intermediate_size`) across the GPUs; where a GPU's share is not a multiple of
the block, vLLM 0.32 either refines the scales to a finer block that divides it (the Triton MoE only, at least 32:
`refine_fp8_moe_block_shape`), pads the shard to whole blocks (a named non-Triton MoE backend, pure TP, no LoRA:
`pad_tp_shard_to_weight_blocks`), or refuses to load (`validate_fp8_block_shape_moe`). Expert parallelism keeps
every expert whole on one GPU, so N stays the checkpoint's.

The rule: where the user has not set enable_expert_parallel and tensor parallelism would split the experts off the
block boundary, the launcher turns expert parallelism on (vLLM's recipes deploy Qwen3-235B-A22B-FP8 and
Qwen3-Coder-480B-A35B-FP8 on 8 GPUs so: TP8 attention, EP8 experts). A checkpoint that splits cleanly
(DeepSeek-V3 at TP8: N 256) keeps plain tensor parallelism. A layout the user forces that vLLM would refuse stops
the start with one line naming the keys, the tensor and the divisibility; one it serves off the block boundary is
served, with one line saying what vLLM does instead.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from . import resolve
from .settings import flag_set

NOTE = "layout"  # every start-log line of this module begins so
REFINE_MIN = 32  # vLLM's refine_fp8_moe_block_shape: the finest block it refines scales to
REFINING_BACKENDS = ("auto", "triton")  # the MoE backends that take a refined block shape (vLLM's Triton experts)
UNQUANTIZED = "no weight blocks"
EP_KEY, TP_KEY = "enable_expert_parallel", "tensor_parallel_size"


@dataclass(frozen=True)
class Checkpoint:
    """The fields of a checkpoint's config.json that decide how it splits across GPUs."""

    architecture: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int            # routed experts (0: a dense model)
    moe_n: int              # each expert's intermediate size (gate/up rows, down columns)
    block: tuple[int, int] | None  # weight_block_size of a block-FP8 checkpoint
    dense_mlps: tuple[tuple[str, int], ...] = ()  # tensor-parallel MLPs beside the experts: (name, intermediate size)
    mla: tuple[int, int, int] | None = None  # DeepSeek's attention: qk_nope_head_dim, qk_rope_head_dim, v_head_dim

    @classmethod
    def from_config(cls, cfg: Mapping) -> "Checkpoint":
        cfg = cfg.get("text_config") or cfg
        q = cfg.get("quantization_config") or {}
        block = q.get("weight_block_size") if str(q.get("quant_method", "")).lower() == "fp8" else None
        heads = int(cfg.get("num_attention_heads") or 0)
        hidden = int(cfg.get("hidden_size") or 0)
        experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
        moe_n = int(cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0) or 0)
        dense = []
        if cfg.get("n_routed_experts") and int(cfg.get("first_k_dense_replace") or 0) > 0:
            dense.append(("dense MLP", int(cfg["intermediate_size"])))
        if int(cfg.get("n_shared_experts") or 0) > 0:
            dense.append(("shared expert", int(cfg["n_shared_experts"]) * moe_n))
        mla = None
        if cfg.get("kv_lora_rank"):
            mla = (int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"]))
        return cls(architecture=(cfg.get("architectures") or [cfg.get("model_type", "?")])[0], hidden=hidden,
                   heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
                   head_dim=int(cfg.get("head_dim") or (hidden // heads if heads else 0)), experts=experts,
                   moe_n=moe_n, block=tuple(block) if block else None, dense_mlps=tuple(dense), mla=mla)

    def describe(self) -> str:
        fmt = f"block FP8 {list(self.block)}" if self.block else "no FP8 blocks"
        return f"{self.architecture} ({fmt}, {self.experts} experts, moe_intermediate_size {self.moe_n})"


@dataclass(frozen=True)
class MoeSplit:
    """How one GPU holds the experts under a layout, as vLLM 0.32 loads them."""

    tp: int       # the experts' tensor parallel size (TP x DP without EP; 1 with EP)
    ep: int       # expert parallel size (1 without EP)
    n: int        # each expert's gate/up rows on one GPU
    how: str      # "whole blocks", "scales refined to 64x64 blocks", "padded to whole blocks (N 256)", "refused"
    refusal: str = ""  # why vLLM refuses it (how == "refused")

    @property
    def on_block(self) -> bool:
        return self.how in ("whole blocks", UNQUANTIZED)


def moe_split(ck: Checkpoint, tp: int, dp: int, ep: bool, backend: str = "auto", lora: bool = False) -> MoeSplit:
    """vLLM's FusedMoEParallelConfig.make and resolve_fp8_moe_weight_block_shape, for one layout."""
    world = tp * dp
    use_ep = ep and world > 1
    moe_tp, ep_size = (1, world) if use_ep else (world, 1)
    n = ck.moe_n // moe_tp
    if ck.block is None:
        return MoeSplit(moe_tp, ep_size, n, UNQUANTIZED)
    bn, bk = ck.block
    if n % bn == 0 and (moe_tp == 1 or n % bk == 0):
        return MoeSplit(moe_tp, ep_size, n, "whole blocks")
    refine = math.gcd(bn, bk, n, ck.hidden)
    refine = refine if refine >= REFINE_MIN else None
    backend = (backend or "auto").lower()
    if backend != "auto" and not (refine and backend in REFINING_BACKENDS):
        if bn == bk and moe_tp > 1 and n % bn != 0:  # pad_tp_shard_to_weight_blocks
            if ck.moe_n % bn or ck.hidden % bn or ep_size != 1 or lora:
                return MoeSplit(moe_tp, ep_size, n, "refused",
                                f"moe_backend {backend} cannot take a refined block and vLLM pads a shard to whole "
                                f"blocks only under pure tensor parallelism without LoRA")
            return MoeSplit(moe_tp, ep_size, n, f"padded to whole {bn}-blocks (N {-(-n // bn) * bn}, moe_backend "
                                                f"{backend})")
    if refine is None:
        what = (f"N {n} is not a multiple of block_n {bn}" if n % bn else f"N {n} is not a multiple of block_k {bk}")
        return MoeSplit(moe_tp, ep_size, n, "refused",
                        f"{what}, and no block of {REFINE_MIN} or more divides it to refine the scales to")
    return MoeSplit(moe_tp, ep_size, n, f"scales refined to {refine}x{refine} blocks (the Triton MoE only; "
                                        f"tuned configs are of {bn}x{bk} blocks)")


def dense_refusal(ck: Checkpoint, tp: int) -> str | None:
    """What vLLM refuses in the checkpoint's attention and dense layers at tensor parallelism tp, before loading
    (ModelConfig.verify_with_parallel_config) or while creating the weights (validate_fp8_block_shape, which
    refines nothing); None where it takes them."""
    if ck.heads and ck.heads % tp:
        return f"its {ck.heads} attention heads are not divisible by tensor parallel size {tp}"
    if ck.block is None or tp == 1:
        return None
    bn, bk = ck.block
    columns, rows = [], []  # (tensor, rows per GPU), (tensor, input columns per GPU)
    if ck.mla:
        nope, rope, v = ck.mla
        columns += [("q_b_proj", ck.heads * (nope + rope) // tp), ("kv_b_proj", ck.heads * (nope + v) // tp)]
        rows.append(("o_proj", ck.heads * v // tp))
    else:
        kv = max(ck.kv_heads // tp, 1)
        columns += [("qkv_proj q", ck.heads // tp * ck.head_dim), ("qkv_proj k/v", kv * ck.head_dim)]
        rows.append(("o_proj", ck.heads // tp * ck.head_dim))
    for name, size in ck.dense_mlps:
        columns.append((f"{name} gate_up_proj", size // tp))
        rows.append((f"{name} down_proj", size // tp))
    for name, n in columns:
        if n % bn:
            return f"each GPU holds {n} output rows of {name}, not a multiple of block_n {bn}"
    for name, k in rows:
        if k % bk:
            return f"each GPU holds {k} input columns of {name}, not a multiple of block_k {bk}"
    return None


@dataclass
class Decision:
    default: resolve.ContextDefault | None  # enable_expert_parallel=true where the launcher chooses it
    note: str                               # the start log's layout line


def decide(ck: Checkpoint, entries: Mapping[str, resolve.Resolved], moe_backend: str | None) -> Decision:
    """The layout for the resolved settings; raises ConfigError where vLLM would refuse the user's."""
    tp_entry = entries.get(TP_KEY)
    tp = int(tp_entry.value) if tp_entry is not None and str(tp_entry.value).isdigit() else 1
    dp_entry = entries.get("data_parallel_size")
    dp = int(dp_entry.raw) if dp_entry is not None and dp_entry.raw.strip().isdigit() else 1
    lora_entry = entries.get("enable_lora")
    lora = lora_entry is not None and flag_set(lora_entry.raw)
    ep_entry = entries.get(EP_KEY)
    backend = moe_backend or "auto"
    where = f"{ck.describe()} on TP{tp}" + (f" x DP{dp}" if dp > 1 else "")

    if (why := dense_refusal(ck, tp)) is not None:
        src = tp_entry.source if tp_entry is not None else "default"
        raise resolve.ConfigError(TP_KEY, src, f"{tp}: vLLM refuses {ck.architecture} so: {why}")
    if not ck.experts:
        if ep_entry is not None and flag_set(ep_entry.raw):
            raise resolve.ConfigError(EP_KEY, ep_entry.source, f"{ep_entry.raw}: {ck.architecture} has no experts "
                                      "(vLLM refuses expert parallelism for it)")
        return Decision(None, f"{NOTE}: {where}: no experts, tensor parallelism only")
    if ep_entry is not None:  # the user chose
        split = moe_split(ck, tp, dp, flag_set(ep_entry.raw), backend, lora)
        if split.how == "refused":
            raise resolve.ConfigError(
                EP_KEY, ep_entry.source,
                f"{ep_entry.raw} with {TP_KEY}={tp} ({tp_entry.source if tp_entry else 'default'}): each GPU would "
                f"hold N {split.n} of the experts' gate/up weight (w13, moe_intermediate_size {ck.moe_n} / "
                f"{split.tp}), and vLLM refuses it: {split.refusal}; set {EP_KEY}=true or a smaller {TP_KEY}")
        return Decision(None, f"{NOTE}: {where}: {_experts(ck, split)} ({EP_KEY} from {ep_entry.source})")
    split = moe_split(ck, tp, dp, False, backend, lora)
    if split.on_block or tp * dp == 1:
        return Decision(None, f"{NOTE}: {where}: {_experts(ck, split)}")
    ep_split = moe_split(ck, tp, dp, True, backend, lora)
    why = (f"at TP{split.tp} each GPU would hold N {split.n} of every expert's gate/up weight, not a multiple "
           f"of the {ck.block[0]}-block ({'vLLM refuses it' if split.how == 'refused' else 'vLLM: ' + split.how})")
    if not ep_split.on_block:  # expert parallelism does not help: vLLM's own handling of TP stands
        if split.how == "refused":
            raise resolve.ConfigError(TP_KEY, tp_entry.source if tp_entry else "default",
                                      f"{tp}: {why}, nor whole under expert parallelism: {split.refusal}")
        return Decision(None, f"{NOTE}: {where}: {_experts(ck, split)}")
    return Decision(resolve.ContextDefault(EP_KEY, "true", f"{ck.architecture}: whole experts per GPU"),
                    f"{NOTE}: {where}: {_experts(ck, ep_split)}: expert parallelism chosen: {why}; "
                    f"{EP_KEY}=false keeps tensor parallelism")


def _experts(ck: Checkpoint, split: MoeSplit) -> str:
    if split.ep > 1:
        return (f"EP{split.ep} experts ({ck.experts // split.ep} of {ck.experts} per GPU, N {split.n}, "
                f"{split.how})")
    return f"TP{split.tp} experts (N {split.n} of {ck.moe_n} per GPU, {split.how})"


def hub_cache(env: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it from the environment."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def read_config(kind: str, model_path: str, revision: str | None,
                env: Mapping[str, str]) -> tuple[dict | None, str]:
    """The model's config.json as the launcher can read it before the engine starts (a local folder, /opt/ml/model,
    an s3:// model once downloaded, a hub id's config in the local Hugging Face cache), else None and why not. The
    one reading of it: the kernels and the layout both decide from it."""
    if kind == "hub":
        try:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(model_path, "config.json", cache_dir=hub_cache(env), revision=revision)
        except Exception:  # an id the hub library refuses: vLLM names it when it loads
            found = None
        if not isinstance(found, str):
            return None, f"{model_path}'s config.json is not in the Hugging Face cache ({hub_cache(env)})"
        path = Path(found)
    else:
        path = Path(model_path) / "config.json"
        if not path.is_file():
            return None, f"{path} is not downloaded yet" if kind == "s3" else f"{path} does not exist"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{path} unreadable ({type(e).__name__}: {e})"
    return (config, "") if isinstance(config, dict) else (None, f"{path} holds no JSON object")


def plan_layout(kind: str, config: dict | None, no_config: str, entries: Mapping[str, resolve.Resolved],
                moe_backend: str | None) -> Decision | None:
    """The layout decision for the model's config (read_config's answer), or None for the embedded tiny model; raises
    ConfigError where vLLM would refuse the layout the user set."""
    if kind == "embedded":
        return None
    if config is None:
        return Decision(None, f"{NOTE}: not checked: {no_config}; vLLM checks it while loading")
    try:
        ck = Checkpoint.from_config(config)
    except (ValueError, TypeError, KeyError) as e:
        return Decision(None, f"{NOTE}: not checked: config.json lacks a field ({type(e).__name__}: {e})")
    return decide(ck, entries, moe_backend)
