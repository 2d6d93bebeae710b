"""Multi-LoRA and sticky sessions as SageMaker and LMI send them, on the real CPU engine.

One server serves a model directory laid out as LMI expects: a model, plus a LoRA adapter the test
makes in adapters/tiny-lora/; sessions are on by default, as in LMI. The model is a tiny dense Qwen3
with the embedded model's tokenizer: vLLM 0.32 serves LoRA on MoE layers only through a Triton
kernel, which the CPU build lacks.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from conftest import start_launcher, stop

pytestmark = pytest.mark.engine

PROMPT = "Deep learning is"
N = 12
ADAPTER = "tiny-lora"
ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
SESSION_HEADER = "X-Amzn-SageMaker-Session-Id"


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


# LMI's adapters/<name>/model.py: its input formatter serves the requests for that adapter only.
ADAPTER_MODEL_PY = '''from djl_python.input_parser import input_formatter


@input_formatter
def adapter_input(decoded_payload, tokenizer=None, adapter_name=None, **kwargs):
    if adapter_name != "tiny-lora" or tokenizer is None:
        raise ValueError(f"called for adapter {adapter_name!r} with tokenizer {tokenizer!r}")
    if "adapterPrompt" in decoded_payload:
        decoded_payload["inputs"] = decoded_payload.pop("adapterPrompt")
    return decoded_payload
'''


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    from serving.tiny_model import default_model_dir, ensure

    mdir = make_dense_model(tmp_path_factory.mktemp("model"), ensure(default_model_dir()))
    make_lora(mdir / "adapters" / ADAPTER, mdir)
    (mdir / "adapters" / ADAPTER / "model.py").write_text(ADAPTER_MODEL_PY)
    srv = start_launcher(tmp_path_factory.mktemp("lora"), {"SERVING_MODEL_DIR": str(mdir)})
    with httpx.Client(base_url=srv.url, timeout=120) as client:
        yield srv, client
    stop(srv.proc)


def generate(client, headers=None, **body) -> httpx.Response:
    doc = {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "ignore_eos_token": True}, **body}
    return client.post("/invocations", json=doc, headers=headers or {})


def test_adapters_in_the_model_folder_are_served(lora_server):
    srv, client = lora_server
    log = srv.log()
    assert f"LoRA adapters: {ADAPTER} (chosen per request" in log
    assert "setting enable_lora=true  [default (LoRA adapters in the model's adapters/)" in log
    base = generate(client).json()["generated_text"]
    by_body = generate(client, adapters=ADAPTER)
    assert by_body.status_code == 200, by_body.text
    by_header = generate(client, headers={ADAPTER_HEADER: ADAPTER})
    assert by_body.json()["generated_text"] == by_header.json()["generated_text"] != base
    # An OpenAI body with SageMaker's header is served by vLLM's own hooks: the same adapter, the same text.
    r = client.post("/invocations", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True},
                    headers={ADAPTER_HEADER: ADAPTER})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == by_body.json()["generated_text"]
    stream = generate(client, adapters=[ADAPTER], stream=True)
    assert json.loads(stream.text.splitlines()[-1])["generated_text"] == by_body.json()["generated_text"]


def test_adapters_own_model_py_formats_that_adapters_requests(lora_server):
    srv, client = lora_server
    expected = generate(client, adapters=ADAPTER).json()["generated_text"]
    body = {"adapterPrompt": PROMPT, "parameters": {"max_new_tokens": N, "ignore_eos_token": True}}
    for how in ({"json": {**body, "adapters": ADAPTER}}, {"json": body, "headers": {ADAPTER_HEADER: ADAPTER}}):
        r = client.post("/invocations", **how)
        assert r.status_code == 200, r.text
        assert r.json()["generated_text"] == expected
    r = client.post("/invocations", json=body)  # the base model has no formatter: adapterPrompt is no body kind
    assert r.status_code == 424 and "inputs" in r.json()["error"], r.text
    assert f"adapters/{ADAPTER}/model.py: LMI input formatter adapter_input" in srv.log()


def openai_token_ids(client, kind, headers=None, **fields) -> list[int]:
    doc = ({"prompt": PROMPT} if kind == "completion" else {"messages": [{"role": "user", "content": PROMPT}]})
    doc.update(max_tokens=N, temperature=0, ignore_eos=True, return_token_ids=True, **fields)
    r = client.post("/invocations", json=doc, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_openai_bodies_name_the_adapter_in_the_body(lora_server, kind):
    """vLLM's SageMaker hooks take an OpenAI body's adapter from the header only; LMI's client names it
    with the body field `adapters` (as LMI's vLLM handler reads it), OpenAI clients with `model`."""
    _, client = lora_server
    base = openai_token_ids(client, kind)
    by_header = openai_token_ids(client, kind, {ADAPTER_HEADER: ADAPTER})
    assert len(base) == N and by_header != base
    assert openai_token_ids(client, kind, adapters=ADAPTER) == by_header
    assert openai_token_ids(client, kind, adapters=[ADAPTER], model=ADAPTER) == by_header
    assert openai_token_ids(client, kind, model=ADAPTER) == by_header
    assert openai_token_ids(client, kind, {ADAPTER_HEADER: ADAPTER}, adapters=ADAPTER) == by_header
    assert openai_token_ids(client, kind, adapters=None) == base


@pytest.mark.parametrize("fields,headers,error", [
    ({"adapters": "no-such-adapter"}, None, "adapters: no LoRA adapter named 'no-such-adapter'; served: tiny-lora"),
    ({"adapters": ADAPTER}, {ADAPTER_HEADER: "other"}, "adapters: the request names different LoRA adapters"),
    ({"adapters": 3}, None, "adapters: give one LoRA adapter's name"),
    ({"adapters": [ADAPTER, "other"]}, None, "adapters: give one LoRA adapter's name"),
], ids=["unknown", "differs-from-header", "not-a-name", "two-names"])
def test_openai_body_with_a_bad_adapters_field_gets_424(lora_server, fields, headers, error):
    _, client = lora_server
    r = client.post("/invocations", json={"prompt": PROMPT, "max_tokens": 2, **fields}, headers=headers or {})
    assert r.status_code == 424, r.text
    assert r.json()["field"] == "adapters" and r.json()["error"].startswith(error)


@pytest.mark.parametrize("body,headers,field", [
    ({"adapters": "no-such-adapter"}, None, "adapters"),
    ({"adapters": ADAPTER}, {ADAPTER_HEADER: "other"}, "adapters"),
    ({"inputs": ["a", "b"], "adapters": [ADAPTER, "other"]}, None, "adapters"),
    ({}, {SESSION_HEADER: "no-such-session"}, SESSION_HEADER),
])
def test_bad_adapter_or_session_gets_424_naming_it(lora_server, body, headers, field):
    _, client = lora_server
    r = generate(client, headers, **body)
    assert r.status_code == 424, r.text
    assert r.json()["field"] == field and r.json()["error"].startswith(field)


def test_sticky_session_lifecycle(lora_server):
    _, client = lora_server
    created = client.post("/invocations", json={"requestType": "NEW_SESSION"})
    assert created.status_code == 200, created.text
    # SageMaker's contract: the header; LMI's client: a JSON body it can parse.
    sid, expires = created.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")
    # LMI answers a create with this name (its own client reads it): the same value
    assert created.headers[SESSION_HEADER] == created.headers["X-Amzn-SageMaker-New-Session-Id"]
    assert expires.strip().startswith("Expires=")
    assert created.headers["content-type"] == "application/json"
    doc = created.json()
    assert (doc["session_id"], doc["expires"]) == (sid.strip(), expires.strip().removeprefix("Expires="))
    sid = sid.strip()
    assert generate(client, {SESSION_HEADER: sid}).status_code == 200
    r = client.post("/invocations", json={"prompt": PROMPT, "max_tokens": 2}, headers={SESSION_HEADER: sid})
    assert r.status_code == 200, r.text
    closed = client.post("/invocations", json={"requestType": "CLOSE"}, headers={SESSION_HEADER: sid})
    assert closed.status_code == 200, closed.text
    assert closed.headers["X-Amzn-SageMaker-Closed-Session-Id"] == sid
    assert closed.json()["closed_session_id"] == sid
    r = generate(client, {SESSION_HEADER: sid})
    assert r.status_code == 424 and r.json()["field"] == SESSION_HEADER
