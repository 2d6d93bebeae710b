"""option.cuda_graph_max_tokens: the capture sizes the launcher hands vLLM, merged into the user's compilation config,
checked by vLLM's own parser and CompilationConfig, and the cases where it is not applied (each with a note)."""
from __future__ import annotations

import json

import pytest

from serving import cuda_graphs, launcher, resolve


def plan(va, tmp_path, env):
    # option.norm_quant at vllm: its additions to the same config are tests/test_compile_passes.py's subject
    return launcher.plan({"SERVING_MODEL_DIR": str(tmp_path), "OPTION_NORM_QUANT": "vllm", **env}, va)


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
