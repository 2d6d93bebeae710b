"""option.cuda_graph_max_tokens and option.cuda_graph_full_steps: the capture sizes and the CUDA-graph mode the launcher
hands vLLM, merged into the user's compilation config, checked by vLLM's own parser and CompilationConfig (patched:
patch 0013's fallback), and the cases where they are not applied (each with a note)."""
from __future__ import annotations

import json

import pytest

from serving import cuda_graphs, launcher, resolve


def plan(va, tmp_path, env, full_steps="false"):
    # option.norm_quant at vllm: its additions to the same config are tests/test_compile_passes.py's subject;
    # the sizes' tests leave the mode out, the mode's tests (full_steps=None: the default) put it in
    fixed = {"OPTION_NORM_QUANT": "vllm"} | ({"OPTION_CUDA_GRAPH_FULL_STEPS": full_steps} if full_steps else {})
    return launcher.plan({"SERVING_MODEL_DIR": str(tmp_path), **fixed, **env}, va)


def graph_config(p) -> dict | None:
    a = p.argv
    return json.loads(a[a.index("--compilation-config") + 1]) if "--compilation-config" in a else None


@pytest.mark.parametrize("max_tokens,seqs", [(8192, 128), (8192, None), (5000, 256), (1000, 64)])
def test_every_step_up_to_the_limit_pads_by_under_a_quarter(max_tokens, seqs):
    sizes = cuda_graphs.capture_sizes(max_tokens, seqs)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_tokens
    own = cuda_graphs.vllm_default_sizes(seqs)
    assert [n for n in sizes if n <= own[-1]] == [n for n in own if n <= max_tokens]  # vLLM's own sizes kept
    for n in range(own[-1] + 1, max_tokens + 1):
        padded = next(s for s in sizes if s >= n)
        assert (padded - n) / n < 0.25, (n, padded)


def test_vllm_own_sizes_as_vllm_computes_them():
    # vLLM 0.32's _set_cudagraph_sizes at max_num_seqs 128 (the engine bench's batch limit): 1, 2, 4, 8..248 by 8, 256
    assert cuda_graphs.vllm_default_sizes(128) == [1, 2, 4, *range(8, 256, 8), 256]
    assert cuda_graphs.vllm_default_sizes(None)[-3:] == [480, 496, 512]
    assert cuda_graphs.vllm_default_sizes(100)[-2:] == [192, 200] and 100 in cuda_graphs.vllm_default_sizes(100)


def test_off_on_the_cpu_build_and_a_note_when_the_user_asks(va, tmp_path):
    p = plan(va, tmp_path, {})  # this machine is the CPU build
    assert graph_config(p) is None and p.settings.cuda_graph_max_tokens == 0
    assert p.resolved["cuda_graph_max_tokens"].source == "default (CPU build: no CUDA graphs)"
    assert not any("cuda_graph_max_tokens" in n for n in p.notes)
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "8192"})
    assert graph_config(p) is None
    assert any("cuda_graph_max_tokens=8192 ignored: the CPU build" in n for n in p.notes)


def test_on_by_default_on_the_gpu_build(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {})
    assert p.resolved["cuda_graph_max_tokens"].source == "default"
    assert graph_config(p) == {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192)}
    assert any("CUDA graphs for steps of up to 8192 tokens" in n for n in p.notes)
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "0"})
    assert graph_config(p) is None and not any("cuda_graph_max_tokens" in n for n in p.notes)


def test_nothing_added_where_vllms_own_sizes_reach(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_MAX_NUM_BATCHED_TOKENS": "256", "OPTION_MAX_ROLLING_BATCH_SIZE": "128"})
    assert graph_config(p) is None and not any("cuda_graph_max_tokens" in n for n in p.notes)


def test_sizes_reach_vllm_through_its_parser_and_config(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "8192", "OPTION_MAX_ROLLING_BATCH_SIZE": "128"})
    config = graph_config(p)
    assert config == {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192, 128)}
    assert any("CUDA graphs for steps of up to 8192 tokens" in n for n in p.notes)
    from vllm.config import CompilationConfig
    assert CompilationConfig(**config).cudagraph_capture_sizes == config["cudagraph_capture_sizes"]


def test_merged_into_the_users_compilation_config_and_capped_by_the_step_budget(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "8192", "OPTION_COMPILATION_CONFIG": '{"mode": 0}',
                            "OPTION_MAX_NUM_BATCHED_TOKENS": "2048"})
    config = graph_config(p)
    assert config["mode"] == 0 and config["cudagraph_capture_sizes"][-1] == 2048
    assert p.argv.count("--compilation-config") == 1


@pytest.mark.parametrize("env,why", [
    ({"OPTION_COMPILATION_CONFIG": '{"cudagraph_capture_sizes": [1, 2]}'}, "sets cudagraph_capture_sizes"),
    ({"OPTION_COMPILATION_CONFIG": '{"max_cudagraph_capture_size": 64}'}, "sets max_cudagraph_capture_size"),
    ({"OPTION_COMPILATION_CONFIG": '{"cudagraph_mode": "NONE"}'}, "sets cudagraph_mode NONE"),
    ({"OPTION_ENFORCE_EAGER": "true"}, "enforce_eager runs no CUDA graphs"),
])
def test_the_users_own_choice_wins_with_a_note(va, tmp_path, gpu_build, env, why):
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "4096", **env})
    user = env.get("OPTION_COMPILATION_CONFIG")
    assert (graph_config(p) is None) if user is None else (graph_config(p) == json.loads(user))
    assert any(n.startswith("cuda_graph_max_tokens=4096 ignored") and why in n for n in p.notes), p.notes


def test_a_negative_value_names_the_setting(va, tmp_path):
    with pytest.raises(resolve.ConfigError, match=r"cuda_graph_max_tokens from env OPTION_CUDA_GRAPH_MAX_TOKENS: "
                                                   r"'-1' must be 0 or a positive integer"):
        plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "-1"})


def test_full_steps_on_by_default_on_the_gpu_build_and_read_by_vllm_as_full(va, tmp_path, gpu_build):
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CUDAGraphMode

    p = plan(va, tmp_path, {}, full_steps=None)
    assert p.resolved["cuda_graph_full_steps"].source == "default" and p.settings.cuda_graph_full_steps is True
    config = graph_config(p)
    assert config == {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192), "cudagraph_mode": "FULL"}
    assert CompilationConfig(**config).cudagraph_mode == CUDAGraphMode.FULL
    assert any("compilation cudagraph_mode FULL" in n for n in p.notes), p.notes
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_FULL_STEPS": "false"}, full_steps=None)
    assert "cudagraph_mode" not in graph_config(p) and not any("cuda_graph_full_steps" in n for n in p.notes)


def test_full_steps_off_on_the_cpu_build_and_a_note_when_the_user_asks(va, tmp_path):
    p = plan(va, tmp_path, {}, full_steps=None)
    assert graph_config(p) is None and p.settings.cuda_graph_full_steps is False
    assert p.resolved["cuda_graph_full_steps"].source == "default (CPU build: no CUDA graphs)"
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_FULL_STEPS": "true"}, full_steps=None)
    assert graph_config(p) is None
    assert any("cuda_graph_full_steps=true ignored: the CPU build" in n for n in p.notes), p.notes


@pytest.mark.parametrize("env,why", [
    ({"OPTION_COMPILATION_CONFIG": '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'}, "sets cudagraph_mode FULL_AND_PIECEWISE"),
    ({"OPTION_COMPILATION_CONFIG": '{"mode": 0}'}, "sets mode 0"),
    ({"OPTION_ENFORCE_EAGER": "true"}, "enforce_eager runs no CUDA graphs"),
    ({"OPTION_KV_TRANSFER_CONFIG": '{"kv_connector": "HiSparseConnector", "kv_role": "kv_both"}'},
     "kv_transfer_config (env OPTION_KV_TRANSFER_CONFIG) sets a KV connector"),
    ({"OPTION_ENABLE_LORA": "true"}, "enable_lora (env OPTION_ENABLE_LORA): vLLM would capture each full graph"),
])
def test_full_steps_leave_the_users_own_choice_with_a_note(va, tmp_path, gpu_build, env, why):
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "0", **env}, full_steps=None)
    user = env.get("OPTION_COMPILATION_CONFIG")
    assert (graph_config(p) is None) if user is None else (graph_config(p) == json.loads(user))
    assert any(n.startswith("cuda_graph_full_steps=true ignored") and why in n for n in p.notes), p.notes


def test_full_steps_keep_the_users_other_compilation_keys(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_COMPILATION_CONFIG": '{"mode": "VLLM_COMPILE", "cudagraph_num_of_warmups": 2}'},
             full_steps=None)
    config = graph_config(p)
    assert config["mode"] == "VLLM_COMPILE" and config["cudagraph_num_of_warmups"] == 2
    assert config["cudagraph_mode"] == "FULL" and config["cudagraph_capture_sizes"][-1] == 8192


@pytest.mark.parametrize("support,resolved", [("ALWAYS", "FULL"), ("UNIFORM_BATCH", "FULL_AND_PIECEWISE"),
                                               ("UNIFORM_SINGLE_TOKEN_DECODE", "FULL_AND_PIECEWISE"),
                                               ("NEVER", "PIECEWISE")])
def test_vllm_resolves_full_to_what_the_attention_backend_can_run(support, resolved):
    """vLLM's own resolution of the launcher's FULL against each level of attention CUDA-graph support, as the GPU
    worker calls it at start: FlashAttention 3 (ALWAYS) keeps it; a backend that runs only uniform decode batches in
    one graph gets vLLM's default FULL_AND_PIECEWISE; one that runs none gets PIECEWISE, where stock vLLM 0.32 raises
    (patch 0013)."""
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    config = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode="FULL",
                               cudagraph_capture_sizes=[1, 2, 4, 8])
    config.set_splitting_ops_for_v1(all2all_backend="", data_parallel_size=1)
    assert config.splitting_ops_contain_attention()
    mode = config.resolve_cudagraph_mode_and_sizes(AttentionCGSupport[support], "TestBackend", max_num_reqs=8)
    assert mode == CUDAGraphMode[resolved]


def test_without_piecewise_compilation_a_backend_with_no_full_graph_still_fails_clearly():
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode
    from vllm.v1.attention.backend import AttentionCGSupport

    config = CompilationConfig(mode=CompilationMode.NONE, cudagraph_mode="FULL", cudagraph_capture_sizes=[1, 2])
    with pytest.raises(ValueError, match=r"CUDAGraphMode.FULL is not supported with TestBackend backend .*"
                                         r"please try cudagraph_mode=PIECEWISE"):
        config.resolve_cudagraph_mode_and_sizes(AttentionCGSupport.NEVER, "TestBackend", max_num_reqs=2)


def test_full_steps_leave_a_model_with_lora_adapters_to_vllms_mode(va, tmp_path, gpu_build):
    """A model folder with an adapters/ folder turns LoRA on (the launcher's context default), which keeps vLLM's
    mode: with LoRA vLLM captures every graph once per count of active adapters."""
    (tmp_path / "config.json").write_text("{}")
    adapter = tmp_path / "adapters" / "fr"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "target_modules": ["q_proj"]}))
    p = plan(va, tmp_path, {}, full_steps=None)
    assert p.resolved["enable_lora"].source.startswith("default (LoRA adapters")
    assert "cudagraph_mode" not in (graph_config(p) or {})
    assert any(n.startswith("cuda_graph_full_steps=true ignored: enable_lora (default") for n in p.notes), p.notes
