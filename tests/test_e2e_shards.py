"""The engine bench's shard models (bench/e2e/shards.py): each layout preset is one rank of its deployment, the
disk size the bench checks for is what serving.tiny_model writes, and the command line refuses shapes that do not
split over the ranks it is asked for."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench.e2e.shards import checkpoint_bytes, preset_spec
from serving.tiny_model import FP8_BLOCK, TinySpec, holds, make
from test_tiny_model import DEEPSEEK

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("spec", [TinySpec(layers=3), TinySpec(layers=3, fp8=True),
                                  TinySpec(layers=2, fp8=True, fp8_scheme="static"),
                                  TinySpec(layers=3, hidden=384, moe_intermediate=384, fp8=True, fp8_scheme="block"),
                                  replace(DEEPSEEK, layers=4, fp8=True, fp8_scheme="block")],
                         ids=["bf16", "tensor", "static", "block", "deepseek-block"])
def test_checkpoint_bytes_are_the_tensor_bytes_make_writes(tmp_path, spec):
    """checkpoint_bytes (what the engine bench checks the disk for before a lease makes a shard) is the data of the
    model.safetensors that make writes: its size less the 8-byte length and the JSON header it gives; holds says
    the folder has that model and no other."""
    out = make(tmp_path / "m", spec)
    raw = (out / "model.safetensors").read_bytes()
    header = int.from_bytes(raw[:8], "little")
    assert checkpoint_bytes(spec) == len(raw) - 8 - header
    assert holds(out, spec) and not holds(out, TinySpec(layers=spec.layers + 1)) and not holds(tmp_path / "x", spec)



def test_tp_friendly_check_rejects_indivisible_shapes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.e2e.shards", "--out", str(tmp_path / "x"), "--experts", "6",
                        "--top-k", "2", "--tp-friendly", "8"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--experts=6 is not divisible by --tp-friendly=8" in r.stderr



# vLLM's recipes for the block-FP8 checkpoints: the whole model's experts, top-k and hidden size, and the
# expert-parallel (EP8) or tensor-parallel (TP4) rank each layout preset stands for
OFFICIAL_LAYOUTS = {
    "qwen3-235b-a22b-ep8": dict(experts=128, top_k=8, hidden=4096, moe_intermediate=1536, ep=8, tp=1),
    "qwen3-coder-480b-a35b-ep8": dict(experts=160, top_k=8, hidden=6144, moe_intermediate=2560, ep=8, tp=1),
    "deepseek-v3-ep8": dict(experts=256, top_k=8, hidden=7168, moe_intermediate=2048, ep=8, tp=1),
    "qwen3-235b-a22b-tp4": dict(experts=128, top_k=8, hidden=4096, moe_intermediate=1536, ep=1, tp=4),
    "qwen3-coder-480b-a35b-tp4": dict(experts=160, top_k=8, hidden=6144, moe_intermediate=2560, ep=1, tp=4),
}


@pytest.mark.parametrize("name", sorted(OFFICIAL_LAYOUTS))
def test_a_layout_preset_is_one_rank_of_its_deployment(name):
    """A rank of EP holds experts/EP experts whole and sees, per token, top_k x local/experts (token, local expert)
    pairs on average; a TP rank holds every expert with N/TP. The preset has that rank's GEMMs, the same pairs per
    token, block FP8's N % 128, and a harness shape of the same dimensions (the shape its config file is tuned on)."""
    from bench.kernels.moe.shapes import SHAPES

    full, spec = OFFICIAL_LAYOUTS[name], preset_spec(name)
    assert spec.experts == full["experts"] // full["ep"]
    assert spec.moe_intermediate == full["moe_intermediate"] // full["tp"]
    pairs_per_token = full["top_k"] * spec.experts / full["experts"]
    assert spec.top_k == (pairs_per_token if full["ep"] > 1 else full["top_k"])
    assert spec.hidden == full["hidden"] and spec.moe_intermediate % FP8_BLOCK == 0
    TinySpec(**{**spec.__dict__, "fp8": True, "fp8_scheme": "block"}).check()
    assert [s for s in SHAPES.values() if (s["E"], s["topk"], s["H"], s["N"], s["block"]) ==
            (spec.experts, spec.top_k, spec.hidden, spec.moe_intermediate, [FP8_BLOCK, FP8_BLOCK])]



def test_the_deepseek_mla_preset_is_one_tp8_rank_of_deepseek_v3():
    """deepseek-v3-tp8-mla: DeepSeek-V3's config (61 layers, 128 heads, hidden 7,168, q and kv ranks 1,536 and 512,
    head parts 128 + 64 and values 128, 256 experts of 2,048 top-8 in 4 of 8 groups, one shared expert, three dense
    first layers of 18,432) with what TP8 divides divided by 8."""
    from bench.kernels.moe.shapes import SHAPES

    spec = preset_spec("deepseek-v3-tp8-mla")
    assert spec.arch == "deepseek_v3" and spec.heads == 128 // 8 and spec.hidden == 7168
    assert (spec.q_lora_rank, spec.kv_lora_rank, spec.head_dim, spec.rope_head_dim, spec.v_head_dim) == \
        (1536, 512, 128, 64, 128)
    assert (spec.experts, spec.top_k, spec.expert_groups, spec.topk_groups) == (256, 8, 8, 4)
    assert spec.moe_intermediate == 2048 // 8 and spec.shared_experts * spec.moe_intermediate == 2048 // 8
    assert (spec.dense_layers, spec.dense_intermediate) == (3, 18432 // 8)
    spec.check()
    # its routed experts are the TP8 harness shape that the shipped E=256,N=256 block file was tuned on
    assert SHAPES["deepseek-v3-tp8"]["E"] == spec.experts and SHAPES["deepseek-v3-tp8"]["N"] == spec.moe_intermediate
