"""The compilation passes the launcher changes (serving/compile_passes.py): option.qk_norm_rope_fusion (vLLM's Q/K
RMSNorm + RoPE fusion pass on) and option.norm_quant (its RMSNorm + FP8 quantization fusion off, and its quantization
op native), added to the compilation config the launcher hands vLLM (beside the CUDA-graph sizes, into the user's own
config), checked by vLLM's own parser and CompilationConfig, and the cases where they are not applied, each with a
note."""
from __future__ import annotations

import json

import pytest

from serving import compile_passes, cuda_graphs, launcher


def plan(va, tmp_path, env):
    # option.cuda_graph_full_steps off: its cudagraph_mode in the same config is tests/test_cuda_graphs.py's subject
    return launcher.plan({"SERVING_MODEL_DIR": str(tmp_path), "OPTION_CUDA_GRAPH_FULL_STEPS": "false", **env}, va)


def compile_config(p) -> dict | None:
    a = p.argv
    assert a.count("--compilation-config") <= 1
    return json.loads(a[a.index("--compilation-config") + 1]) if "--compilation-config" in a else None


def test_off_by_default(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {})
    assert p.settings.qk_norm_rope_fusion is False
    assert compile_passes.QK_NORM_ROPE_PASS not in compile_config(p)["pass_config"]
    assert not any("qk_norm_rope_fusion" in n for n in p.notes)


def test_on_it_joins_the_graph_sizes_and_vllm_reads_the_pass(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true"})
    config = compile_config(p)
    assert config == {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192),
                      "pass_config": {"enable_qk_norm_rope_fusion": True, "fuse_norm_quant": False},
                      "custom_ops": ["-quant_fp8"]}  # option.norm_quant's default beside it
    assert any("fused Q/K RMSNorm + RoPE kernel (qk_norm_rope_fusion)" in n for n in p.notes)
    # the flag went through vLLM's own parser (the launcher checks every value there); vLLM's PassConfig has the field
    # and takes the config (on a platform without the CUDA kernel, as here, it then turns the pass off with a warning)
    import dataclasses

    from vllm.config.compilation import CompilationConfig, PassConfig
    assert compile_passes.QK_NORM_ROPE_PASS in {f.name for f in dataclasses.fields(PassConfig)}
    assert isinstance(getattr(CompilationConfig(**config).pass_config, compile_passes.QK_NORM_ROPE_PASS), bool)


def test_merged_into_the_users_config_without_graph_sizes(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true", "OPTION_CUDA_GRAPH_MAX_TOKENS": "0",
                            "OPTION_COMPILATION_CONFIG": '{"mode": 3, "pass_config": {"fuse_norm_quant": true}}'})
    assert compile_config(p) == {"mode": 3, "pass_config": {"fuse_norm_quant": True,
                                                            "enable_qk_norm_rope_fusion": True}}
    assert any(n.startswith("norm_quant=compiled ignored: compilation_config (env OPTION_COMPILATION_CONFIG) sets "
                            "pass_config.fuse_norm_quant") for n in p.notes), p.notes
    p = plan(va, tmp_path, {"OPTION_QK_NORM_ROPE_FUSION": "true", "OPTION_CUDA_GRAPH_MAX_TOKENS": "0"})
    assert compile_config(p) == {"pass_config": {"enable_qk_norm_rope_fusion": True, "fuse_norm_quant": False},
                                 "custom_ops": ["-quant_fp8"]}


QK_ON = {"OPTION_QK_NORM_ROPE_FUSION": "true"}
SIZES_ON = {"OPTION_COMPILE_DECODE_TOKENS": "8"}


@pytest.mark.parametrize("switch,said,env,why", [
    (QK_ON, "qk_norm_rope_fusion=true",
     {"OPTION_COMPILATION_CONFIG": '{"pass_config": {"enable_qk_norm_rope_fusion": false}}'},
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets pass_config.enable_qk_norm_rope_fusion"),
    (QK_ON, "qk_norm_rope_fusion=true", {"OPTION_ENFORCE_EAGER": "true"}, "enforce_eager compiles nothing"),
    (SIZES_ON, "compile_decode_tokens=8", {"OPTION_COMPILATION_CONFIG": '{"compile_sizes": [1]}'},
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets compile_sizes"),
    (SIZES_ON, "compile_decode_tokens=8", {"OPTION_COMPILATION_CONFIG": '{"mode": 0}'},
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets mode 0: nothing is compiled"),
    (SIZES_ON, "compile_decode_tokens=8", {"OPTION_ENFORCE_EAGER": "true"}, "enforce_eager compiles nothing"),
])
def test_the_users_own_choice_wins_with_a_note(va, tmp_path, gpu_build, switch, said, env, why):
    p = plan(va, tmp_path, {**switch, "OPTION_CUDA_GRAPH_MAX_TOKENS": "0", "OPTION_NORM_QUANT": "vllm", **env})
    user = env.get("OPTION_COMPILATION_CONFIG")
    assert compile_config(p) == (json.loads(user) if user else None)
    assert any(n == f"{said} ignored: {why}" for n in p.notes), p.notes


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


def test_norm_quant_compiled_by_default_and_vllm_leaves_vllms_choice(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {})
    assert p.settings.norm_quant == "compiled"
    assert compile_config(p) == {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192),
                                 "pass_config": {"fuse_norm_quant": False}, "custom_ops": ["-quant_fp8"]}
    assert any("(norm_quant=compiled): compilation pass_config.fuse_norm_quant false, custom_ops -quant_fp8" in n
               for n in p.notes), p.notes
    p = plan(va, tmp_path, {"OPTION_NORM_QUANT": "vllm"})
    assert "pass_config" not in compile_config(p) and not any("norm_quant" in n for n in p.notes)


@pytest.mark.parametrize("env,why", [
    ({"OPTION_COMPILATION_CONFIG": '{"mode": 0}'},
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets mode 0: nothing is compiled"),
    ({"OPTION_COMPILATION_CONFIG": '{"mode": "NONE"}'},
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets mode NONE: nothing is compiled"),
    ({"OPTION_COMPILATION_CONFIG": '{"backend": "eager"}'},
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets backend eager: Inductor generates no kernels"),
    ({"OPTION_OPTIMIZATION_LEVEL": "0"}, "optimization_level 0 (env OPTION_OPTIMIZATION_LEVEL) compiles nothing"),
])
def test_norm_quant_compiled_is_not_applied_where_inductor_compiles_nothing(va, tmp_path, gpu_build, env, why):
    """vLLM's native quantization would run as eager PyTorch there; `separate` still turns the pass off."""
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "0", **env})
    user = env.get("OPTION_COMPILATION_CONFIG")
    assert compile_config(p) == (json.loads(user) if user else None)
    assert any(n == "norm_quant=compiled ignored: " + why for n in p.notes), p.notes
    p = plan(va, tmp_path, {"OPTION_CUDA_GRAPH_MAX_TOKENS": "0", "OPTION_NORM_QUANT": "separate", **env})
    assert compile_config(p)["pass_config"] == {"fuse_norm_quant": False}


@pytest.mark.parametrize("choice,ops,says", [
    ("separate", None, "as separate kernels (norm_quant=separate): compilation pass_config.fuse_norm_quant false"),
    ("compiled", ["-quant_fp8"], "as torch.compile generates them (norm_quant=compiled): compilation "
                                 "pass_config.fuse_norm_quant false, custom_ops -quant_fp8"),
])
def test_norm_quant_turns_vllms_fusion_off_beside_the_other_passes(va, tmp_path, gpu_build, choice, ops, says):
    p = plan(va, tmp_path, {"OPTION_NORM_QUANT": choice, "OPTION_QK_NORM_ROPE_FUSION": "true"})
    config = compile_config(p)
    want = {"cudagraph_capture_sizes": cuda_graphs.capture_sizes(8192),
            "pass_config": {"enable_qk_norm_rope_fusion": True, "fuse_norm_quant": False}}
    assert config == ({**want, "custom_ops": ops} if ops else want)
    assert any(says in n for n in p.notes), p.notes
    from vllm.config.compilation import CompilationConfig
    parsed = CompilationConfig(**config)
    assert parsed.pass_config.fuse_norm_quant is False and ("-quant_fp8" in parsed.custom_ops) == bool(ops)


@pytest.mark.parametrize("user,why", [
    ('{"pass_config": {"fuse_norm_quant": true}}',
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets pass_config.fuse_norm_quant"),
    ('{"custom_ops": ["+quant_fp8"]}',
     "compilation_config (env OPTION_COMPILATION_CONFIG) sets custom_ops for quant_fp8"),
])
def test_norm_quant_yields_to_the_users_own_choice(va, tmp_path, gpu_build, user, why):
    p = plan(va, tmp_path, {"OPTION_NORM_QUANT": "compiled", "OPTION_CUDA_GRAPH_MAX_TOKENS": "0",
                            "OPTION_COMPILATION_CONFIG": user})
    assert compile_config(p) == json.loads(user)
    assert any(n.startswith("norm_quant=compiled ignored: " + why) for n in p.notes), p.notes


def test_norm_quant_is_not_applied_on_the_cpu_build_and_a_bad_value_is_named(va, tmp_path):
    p = plan(va, tmp_path, {})  # this machine is the CPU build: vLLM's choice, without a note
    assert p.settings.norm_quant == "vllm" and compile_config(p) is None and not any("norm_quant" in n for n in p.notes)
    assert p.resolved["norm_quant"].source == "default (CPU build: no FP8 norm + quantization)"
    p = plan(va, tmp_path, {"OPTION_NORM_QUANT": "separate"})
    assert compile_config(p) is None
    assert any("norm_quant=separate ignored: the CPU build" in n for n in p.notes)
    from serving import resolve
    with pytest.raises(resolve.ConfigError, match="norm_quant from env OPTION_NORM_QUANT"):
        plan(va, tmp_path, {"OPTION_NORM_QUANT": "fastest"})


def test_compile_decode_tokens_off_by_default_and_on_gives_vllms_graph_sizes_up_to_it(va, tmp_path, gpu_build):
    p = plan(va, tmp_path, {})
    assert p.settings.compile_decode_tokens == 0 and "compile_sizes" not in compile_config(p)
    assert not any("compile_decode_tokens" in n for n in p.notes)
    p = plan(va, tmp_path, {"OPTION_COMPILE_DECODE_TOKENS": "8"})
    config = compile_config(p)
    assert config["compile_sizes"] == [1, 2, 4, 8] and config["pass_config"] == {"fuse_norm_quant": False}
    assert any("decode steps of 1, 2, 4, 8 tokens (compile_decode_tokens=8): compilation compile_sizes [1, 2, 4, 8]"
               in n for n in p.notes), p.notes
    from vllm.config.compilation import CompilationConfig
    assert CompilationConfig(**config).compile_sizes == [1, 2, 4, 8]
    assert compile_config(plan(va, tmp_path, {"OPTION_COMPILE_DECODE_TOKENS": "12"}))["compile_sizes"] == [1, 2, 4, 8]


def test_compile_decode_tokens_is_not_applied_on_the_cpu_build_and_a_bad_value_is_named(va, tmp_path):
    p = plan(va, tmp_path, {"OPTION_COMPILE_DECODE_TOKENS": "8"})
    assert compile_config(p) is None
    assert any("compile_decode_tokens=8 ignored: the CPU build" in n for n in p.notes)
    from serving import resolve
    with pytest.raises(resolve.ConfigError, match="compile_decode_tokens from env OPTION_COMPILE_DECODE_TOKENS"):
        plan(va, tmp_path, {"OPTION_COMPILE_DECODE_TOKENS": "-1"})
