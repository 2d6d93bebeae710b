"""The adapter server's model: a tiny dense Qwen3 with LoRA adapters in its adapters/ folder, as LMI lays
them out (tests/conftest.py's adapter_server serves it to tests/test_lmi_client.py and tests/test_lora_sessions.py).

Dense: vLLM 0.32 serves LoRA on MoE layers only through a Triton kernel, which the CPU build lacks.
"""
from __future__ import annotations

import json
from pathlib import Path

ADAPTERS = ["alpha", "beta"]  # each a different random LoRA (seed: its index)


def make_lora(out: Path, model_dir: Path, rank: int = 8, seed: int = 0) -> Path:
    """A PEFT LoRA adapter on q_proj and v_proj of every layer, with random weights large enough to
    change what the tiny model generates."""
    import torch
    from safetensors.torch import save_file

    conf = json.loads((model_dir / "config.json").read_text())
    hidden, heads, kv_heads = conf["hidden_size"], conf["num_attention_heads"], conf["num_key_value_heads"]
    head_dim = conf.get("head_dim") or hidden // heads
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(conf["num_hidden_layers"]):
        for name, rows in (("q_proj", heads * head_dim), ("v_proj", kv_heads * head_dim)):
            prefix = f"base_model.model.model.layers.{i}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(rows, rank, generator=gen) * 0.5
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
        "base_model_name_or_path": str(model_dir), "modules_to_save": None}))
    return out


def make_dense_model(out: Path, tokenizer_from: Path) -> Path:
    """A random-weight two-layer dense Qwen3 using another model folder's tokenizer files."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    src = json.loads((tokenizer_from / "config.json").read_text())
    conf = Qwen3Config(vocab_size=src["vocab_size"], hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=2048,
                       bos_token_id=src["bos_token_id"], eos_token_id=src["eos_token_id"], tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen3ForCausalLM(conf).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def printable_dense_model(out: Path) -> Path:
    """make_dense_model's tiny dense Qwen3, its output head made to write printable ASCII
    as the embedded model's is: LMI's client compares generated texts, and skips empty ones."""
    from safetensors.torch import load_file, save_file

    from serving.tiny_model import _printable_output_head, default_model_dir, ensure

    mdir = make_dense_model(out, ensure(default_model_dir()))
    weights = mdir / "model.safetensors"
    state = load_file(weights)
    _printable_output_head(state["lm_head.weight"])
    save_file(state, weights, metadata={"format": "pt"})
    return mdir


# LMI's adapters/<name>/model.py: its input formatter serves the requests for that adapter only (the first).
ADAPTER_MODEL_PY = '''from djl_python.input_parser import input_formatter


@input_formatter
def adapter_input(decoded_payload, tokenizer=None, adapter_name=None, **kwargs):
    if adapter_name != "%s" or tokenizer is None:
        raise ValueError(f"called for adapter {adapter_name!r} with tokenizer {tokenizer!r}")
    if "adapterPrompt" in decoded_payload:
        decoded_payload["inputs"] = decoded_payload.pop("adapterPrompt")
    return decoded_payload
''' % ADAPTERS[0]


def adapter_model_dir(out: Path) -> Path:
    """printable_dense_model with one LoRA adapter per name in ADAPTERS, the first with its own model.py."""
    mdir = printable_dense_model(out)
    for seed, name in enumerate(ADAPTERS):
        make_lora(mdir / "adapters" / name, mdir, seed=seed)
    (mdir / "adapters" / ADAPTERS[0] / "model.py").write_text(ADAPTER_MODEL_PY)
    return mdir
