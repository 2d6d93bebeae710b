"""The project's own tiny Qwen3-MoE (and DeepSeek-V3) maker: tokenizer round-trip, reuse, the FP8 checkpoint
format, the DeepSeek-V3 architecture."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from serving.tiny_model import TinySpec, ensure, make

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    return make(tmp_path_factory.mktemp("m") / "tiny", TinySpec(layers=1))


def test_tokenizer_round_trips_any_text(bf16_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bf16_model))
    text = "Grüße, 世界! tabs\tand\nnewlines"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode())  # one token per byte
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"


def test_config_is_a_qwen3_moe(bf16_model):
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(bf16_model))
    assert c.model_type == "qwen3_moe" and c.num_experts == 8 and c.num_experts_per_tok == 2


def test_ensure_reuses_an_identical_model(bf16_model):
    stamp = (bf16_model / "model.safetensors").stat().st_mtime_ns
    ensure(bf16_model, TinySpec(layers=1))
    assert (bf16_model / "model.safetensors").stat().st_mtime_ns == stamp


def test_command_line_reuse_keeps_an_identical_model(bf16_model):
    """--reuse (the engine bench's models, kept between runs): the same spec leaves the folder as it is."""
    stamp = (bf16_model / "model.safetensors").stat().st_mtime_ns
    r = subprocess.run([sys.executable, "-m", "serving.tiny_model", "--out", str(bf16_model), "--layers", "1",
                        "--reuse"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(bf16_model)
    assert (bf16_model / "model.safetensors").stat().st_mtime_ns == stamp


def test_fp8_checkpoint_format(tmp_path):
    import torch
    from safetensors.torch import load_file
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    out = tmp_path / "fp8"
    r = subprocess.run([sys.executable, "-m", "serving.tiny_model", "--out", str(out), "--fp8", "--layers", "1",
                        "--experts", "16"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    q = Fp8Config.from_config(cfg["quantization_config"])  # vLLM's own parser of the section
    assert q.is_checkpoint_fp8_serialized and q.weight_block_size is None  # per-tensor
    state = load_file(str(out / "model.safetensors"))
    experts = [k for k in state if ".mlp.experts." in k and k.endswith("_proj.weight")]
    assert len(experts) == 16 * 3
    for k in experts + ["model.layers.0.self_attn.q_proj.weight"]:
        assert state[k].dtype == torch.float8_e4m3fn, k
        scale = state[k[: -len("weight")] + "weight_scale"]
        assert scale.dtype == torch.float32 and scale.numel() == 1
        # Dequantized weights are finite and the scale uses the FP8 range.
        w = state[k].float() * scale
        assert torch.isfinite(w).all() and state[k].float().abs().max() > 200
    assert state["model.layers.0.mlp.gate.weight"].dtype == torch.bfloat16  # the router stays unquantized
    assert state["lm_head.weight"].dtype == torch.bfloat16


# DeepSeek-V3's MLA head sizes (vLLM's MLA takes a latent of 512 and a RoPE part of 64), its other sizes tiny
DEEPSEEK = TinySpec(arch="deepseek_v3", layers=3, hidden=256, heads=4, kv_heads=4, head_dim=128, q_lora_rank=128,
                    kv_lora_rank=512, rope_head_dim=64, v_head_dim=128, experts=8, top_k=2, moe_intermediate=128,
                    shared_experts=1, dense_layers=1, dense_intermediate=256, expert_groups=2, topk_groups=1)


def test_a_deepseek_checkpoint_is_one_transformers_and_vllm_read_whole(tmp_path):
    """arch deepseek_v3: transformers' DeepseekV3ForCausalLM takes every tensor (none missing, none left over) and
    generates; the config gives vLLM's DeepSeek-V3 model its router (noaux_tc: sigmoid scores with a correction bias
    it loads, grouped top-k), the dense first layers and the shared expert; block FP8 quantizes every projection,
    MLA's included, and leaves the router and its bias in bf16. (The CPU engine serves such a model with its MLA
    backend; the GPU engine bench serves the deepseek-v3-tp8-mla preset.)"""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    out = make(tmp_path / "bf16", DEEPSEEK)
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert not any(info.values()), info
    assert model.generate(torch.tensor([[72, 105]]), max_new_tokens=2, do_sample=False).shape == (1, 4)
    c = AutoConfig.from_pretrained(str(out))
    assert (c.topk_method, c.scoring_func, c.n_group, c.topk_group) == ("noaux_tc", "sigmoid", 2, 1)
    assert (c.first_k_dense_replace, c.n_shared_experts, c.n_routed_experts) == (1, 1, 8)

    state = load_file(str(make(tmp_path / "fp8", replace(DEEPSEEK, fp8=True, fp8_scheme="block")) /
                          "model.safetensors"))
    for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
        w = state[f"model.layers.1.self_attn.{proj}.weight"]
        scale = state[f"model.layers.1.self_attn.{proj}.weight_scale_inv"]
        assert w.dtype == torch.float8_e4m3fn and scale.shape == (-(-w.shape[0] // 128), -(-w.shape[1] // 128)), proj
    for name in ("model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.shared_experts.down_proj.weight",
                 "model.layers.2.mlp.experts.7.up_proj.weight"):
        assert state[name].dtype == torch.float8_e4m3fn, name
    assert state["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16
    assert not state["model.layers.1.mlp.gate.e_score_correction_bias"].any()
    assert "model.layers.0.mlp.gate.weight" not in state  # a dense first layer has no router
