"""The compilation passes the launcher switches (serving/compile_passes.py): option.qk_norm_rope_fusion (vLLM's Q/K
RMSNorm + RoPE fusion pass on) and option.norm_quant_fusion (its RMSNorm + FP8 quantization fusion off), added to the
compilation config the launcher hands vLLM (beside the CUDA-graph sizes, into the user's own config), checked by
vLLM's own parser and PassConfig, and the cases where they are not applied, each with a note."""
from __future__ import annotations

import json

import pytest

from serving import compile_passes, cuda_graphs, launcher

QK = compile_passes.BY_SETTING["qk_norm_rope_fusion"]
NQ = compile_passes.BY_SETTING["norm_quant_fusion"]


def plan(va, tmp_path, env):
    return launcher.plan({"SERVING_MODEL_DIR": str(tmp_path), **env}, va)


def compile_config(p) -> dict | None:
    a = p.argv
    assert a.count("--compilation-config") <= 1
    return json.loads(a[a.index("--compilation-config") + 1]) if "--compilation-config" in a else None


def test_off_by_default(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {})
    assert p.settings.qk_norm_rope_fusion is False
    assert "pass_config" not in compile_config(p) and not any(QK.setting in n for n in p.notes)


def test_on_it_joins_the_graph_sizes_and_vllm_reads_the_pass(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true"})
    config = compile_config(p)
    assert config == {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192),
                      "pass_config": {"enable_qk_norm_rope_fusion": True}}
    assert any("fused Q/K RMSNorm + RoPE kernel (qk_norm_rope_fusion)" in n for n in p.notes)
    # the flag went through vLLM's own parser (the launcher checks every value there); vLLM's PassConfig has the field
    # and takes the config (on a platform without the CUDA kernel, as here, it then turns the pass off with a warning)
    import dataclasses

    from vllm.config.compilation import CompilationConfig, PassConfig
    assert QK.field in {f.name for f in dataclasses.fields(PassConfig)}
    assert isinstance(getattr(CompilationConfig(**config).pass_config, QK.field), bool)


def test_merged_into_the_users_config_without_graph_sizes(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true", "OPTION_CUDA_GRAPH_MAX_TOKENS": "0",
                            "OPTION_COMPILATION_CONFIG": '{"mode": 3, "pass_config": {"fuse_norm_quant": true}}'})
    assert compile_config(p) == {"mode": 3, "pass_config": {"fuse_norm_quant": True,
                                                            "enable_qk_norm_rope_fusion": True}}
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true", "OPTION_CUDA_GRAPH_MAX_TOKENS": "0"})
    assert compile_config(p) == {"pass_config": {"enable_qk_norm_rope_fusion": True}}


@pytest.mark.parametrize("env,why", [
    ({"OPTION_COMPILATION_CONFIG": '{"pass_config": {"enable_qk_norm_rope_fusion": false}}'},
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets pass_config.enable_qk_norm_rope_fusion"),
    ({"OPTION_ENFORCE_EAGER": "true"}, "enforce_eager compiles nothing"),
])
def test_the_users_own_choice_wins_with_a_note(va, tmp_path, gpu_build, env, why):
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true", "OPTION_CUDA_GRAPH_MAX_TOKENS": "0", **env})
    user = env.get("OPTION_COMPILATION_CONFIG")
    assert compile_config(p) == (json.loads(user) if user else None)
    assert any(n.startswith("qk_norm_rope_fusion=true ignored") and why in n for n in p.notes), p.notes


def test_a_config_vllm_cannot_read_is_refused_by_its_parser_naming_the_setting(va, tmp_path, gpu_build):
    from serving import resolve
    for bad in ('{"pass_config": 3}', "[1]"):
        with pytest.raises(resolve.ConfigError,
                           match="compilation_config from env OPTION_COMPILATION_CONFIG: .*object"):
            plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true", "OPTION_COMPILATION_CONFIG": bad})


def test_not_on_the_cpu_build(va, tmp_path):
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true"})  # this machine is the CPU build
    assert compile_config(p) is None
    assert any("qk_norm_rope_fusion=true ignored: the CPU build" in n for n in p.notes)


def test_a_bad_value_names_the_setting(va, tmp_path, gpu_build):
    from serving import resolve
    with pytest.raises(resolve.ConfigError, match="qk_norm_rope_fusion from env OPTION_QK_NORM_ROPE_FUSION"):
        plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "maybe"})


def test_norm_quant_fusion_leaves_vllms_choice_by_default_and_false_turns_the_pass_off(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {})
    assert p.settings.norm_quant_fusion is True
    assert "pass_config" not in compile_config(p) and not any(NQ.setting in n for n in p.notes)
    p = plan(va, tmp_path, {"OPTION_NORM_QUANT_FUSION": "false", "OPTION_QK_NORM_ROPE_FUSION": "true"})
    config = compile_config(p)
    assert config == {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192),
                      "pass_config": {"enable_qk_norm_rope_fusion": True, "fuse_norm_quant": False}}
    assert any("RMSNorm and its FP8 quantization as separate kernels (norm_quant_fusion)" in n for n in p.notes)
    from vllm.config.compilation import CompilationConfig
    assert CompilationConfig(**config).pass_config.fuse_norm_quant is False


def test_norm_quant_fusion_yields_to_the_users_pass_and_to_the_cpu_build(va, tmp_path, gpu_build):
    user = '{"pass_config": {"fuse_norm_quant": true}}'
    p = plan(va, tmp_path, {"OPTION_NORM_QUANT_FUSION": "false", "OPTION_CUDA_GRAPH_MAX_TOKENS": "0",
                            "OPTION_COMPILATION_CONFIG": user})
    assert compile_config(p) == json.loads(user)
    assert any(n.startswith("norm_quant_fusion=false ignored: compilation_config (env OPTION_COMPILATION_CONFIG) "
                            "sets pass_config.fuse_norm_quant") for n in p.notes), p.notes


def test_norm_quant_fusion_is_not_applied_on_the_cpu_build(va, tmp_path):
    p = plan(va, tmp_path, {"OPTION_NORM_QUANT_FUSION": "false"})
    assert compile_config(p) is None
    assert any("norm_quant_fusion=false ignored: the CPU build" in n for n in p.notes)
