"""Environment the launcher hands the engine for GPU start-up behaviour."""
from __future__ import annotations

from serving import launcher


def _engine_env(extra: dict[str, str]) -> dict[str, str]:
    return launcher.plan({"PATH": "/usr/bin", "HOME": "/tmp", **extra}).env


def test_flashinfer_sampler_is_off_unless_asked_for():
    # On a fresh GPU host FlashInfer compiles its sampler with nvcc at the first start (minutes, or a failed
    # start without nvcc); the image runs vLLM's own sampler unless the user turns FlashInfer's back on.
    assert _engine_env({})["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert _engine_env({"VLLM_USE_FLASHINFER_SAMPLER": "1"})["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert _engine_env({"OPTION_FLASHINFER_SAMPLER": "true"})["VLLM_USE_FLASHINFER_SAMPLER"] == "1"


def test_aot_compile_is_vllms_unless_turned_off():
    # vLLM's AOT compile stays as vLLM sets it (on, with the image's torch) unless the setting or the user's own
    # VLLM_USE_AOT_COMPILE turns it off; the setting wins over vLLM's variable.
    assert "VLLM_USE_AOT_COMPILE" not in _engine_env({})
    assert _engine_env({"VLLM_USE_AOT_COMPILE": "0"})["VLLM_USE_AOT_COMPILE"] == "0"
    assert _engine_env({"OPTION_AOT_COMPILE": "false"})["VLLM_USE_AOT_COMPILE"] == "0"
    assert _engine_env({"OPTION_AOT_COMPILE": "true", "VLLM_USE_AOT_COMPILE": "0"})["VLLM_USE_AOT_COMPILE"] == "1"


def test_the_compile_cache_is_vllms_unless_disabled_and_the_aot_compile_stays_on_without_it():
    # vLLM writes its compile cache (the AOT artifacts among it) unless the setting or the user's own
    # VLLM_DISABLE_COMPILE_CACHE turns it off; the setting wins over vLLM's variable. Without the cache the AOT
    # compile stays on (vLLM alone would turn it off) unless aot_compile or VLLM_USE_AOT_COMPILE says otherwise.
    assert {"VLLM_DISABLE_COMPILE_CACHE", "VLLM_USE_AOT_COMPILE"}.isdisjoint(_engine_env({}))
    off = _engine_env({"VLLM_DISABLE_COMPILE_CACHE": "1"})
    assert (off["VLLM_DISABLE_COMPILE_CACHE"], off["VLLM_USE_AOT_COMPILE"]) == ("1", "1")
    off = _engine_env({"OPTION_DISABLE_COMPILE_CACHE": "true", "OPTION_AOT_COMPILE": "false"})
    assert (off["VLLM_DISABLE_COMPILE_CACHE"], off["VLLM_USE_AOT_COMPILE"]) == ("1", "0")
    on = _engine_env({"OPTION_DISABLE_COMPILE_CACHE": "false", "VLLM_DISABLE_COMPILE_CACHE": "1"})
    assert on["VLLM_DISABLE_COMPILE_CACHE"] == "0" and "VLLM_USE_AOT_COMPILE" not in on
