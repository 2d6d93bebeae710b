"""A corpus of bad configurations: each stops the start with status 2 and one line naming the key.

Hand-written cases run the launcher's own entry (`python -m serving --dry-run`'s main) in this
process (tests/test_settings.py runs it as a real subprocess); generated cases (hypothesis, fixed
seed) go through the same resolution. No engine is started.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from serving import resolve
from serving.launcher import main, plan

EXAMPLES = int(os.environ.get("BAD_CONFIG_EXAMPLES", "40"))
GENERATED = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                     suppress_health_check=list(HealthCheck))

# (id, environment, serving.properties text or None, what the error line must name)
CASES = [
    ("unknown-env-key", {"OPTION_MAX_MODEL_LENN": "4096"}, None, "max_model_lenn"),
    ("unknown-sm-vllm-key", {"SM_VLLM_TENSOR_PARALEL_SIZE": "2"}, None, "tensor_paralel_size"),
    ("unknown-properties-key", {}, "option.rolling_batch_sizee=8\n", "rolling_batch_sizee"),
    ("unknown-top-level-key", {}, "engine_name=Python\n", "engine_name"),
    ("line-without-value", {}, "option.max_model_len\n", "line 1"),
    ("int-not-int", {"OPTION_MAX_MODEL_LEN": "lots"}, None, "max_model_len"),
    ("int-float", {"OPTION_MAX_ROLLING_BATCH_SIZE": "1.5"}, None, "max_num_seqs"),
    ("bool-not-bool", {"OPTION_TRUST_REMOTE_CODE": "maybe"}, None, "trust_remote_code"),
    ("port-negative", {"OPTION_PORT": "-1"}, None, "port"),
    ("port-word", {"SAGEMAKER_BIND_TO_PORT": "http"}, None, "port"),
    ("tp-word", {"OPTION_TENSOR_PARALLEL_DEGREE": "two"}, None, "tensor_parallel_size"),
    ("tp-zero", {"SM_NUM_GPUS": "0"}, None, "tensor_parallel_size"),
    ("tp-max-without-gpus", {"OPTION_TENSOR_PARALLEL_DEGREE": "max", "CUDA_VISIBLE_DEVICES": ""}, None,
     "tensor_parallel_size"),
    ("drain-zero", {"OPTION_SHUTDOWN_TIMEOUT": "0"}, None, "shutdown_timeout"),
    ("request-bytes-unit", {"OPTION_MAX_REQUEST_BYTES": "6MB"}, None, "max_request_bytes"),
    ("vllm-choice", {"OPTION_DTYPE": "float99"}, None, "dtype"),
    ("vllm-float", {"OPTION_GPU_MEMORY_UTILIZATION": "most"}, None, "gpu_memory_utilization"),
    ("rust-frontend-on", {"VLLM_USE_RUST_FRONTEND": "1"}, None, "VLLM_USE_RUST_FRONTEND"),
    ("rust-frontend-word", {"VLLM_USE_RUST_FRONTEND": "yes"}, None, "VLLM_USE_RUST_FRONTEND"),
    ("vllm-switch", {"OPTION_ENFORCE_EAGER": "perhaps"}, None, "enforce_eager"),
    ("vllm-json", {"OPTION_SPECULATIVE_CONFIG": "{not json"}, None, "speculative_config"),
    ("lmi-rolling-batch", {}, "option.rolling_batch=lmi-dist\n", "rolling_batch"),
    ("lmi-engine", {}, "engine=DeepSpeed\n", "engine"),
    ("missing-local-model", {"OPTION_MODEL_ID": "/nonexistent/model"}, None, "model_id"),
    ("missing-relative-model", {"HF_MODEL_ID": "./no-such-folder"}, None, "model_id"),
    ("s3-without-bucket", {"OPTION_MODEL_ID": "s3:///prefix/"}, None, "model_id"),
]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith(("OPTION_", "SM_VLLM_", "HF_", "SM_NUM_GPUS", "SAGEMAKER_", "MAX_BATCH", "CUDA_VISIBLE")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("SERVING_MODEL_DIR", str(tmp_path))
    return monkeypatch


@pytest.mark.parametrize("env,props,key", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_configuration_exits_2_with_one_line_naming_the_key(clean_env, tmp_path, capsys, env, props, key):
    for k, v in env.items():
        clean_env.setenv(k, v)
    if props is not None:
        (tmp_path / "serving.properties").write_text(props)
    rc = main(["--dry-run"])
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if line.startswith("configuration error:")]
    assert rc == 2 and out.out == "", out.out
    assert len(errors) == 1 and key in errors[0], out.err


@pytest.mark.parametrize("env", [{"OPTION_TENSOR_PARALLEL_DEGREE": "8"}, {"SM_NUM_GPUS": "4"},
                                 {"OPTION_TENSOR_PARALLEL_SIZE": "3", "CUDA_VISIBLE_DEVICES": "0,1"}])
def test_tensor_parallel_above_the_gpu_count_is_named(vllm_args, tmp_path, env):
    """On the GPU build each rank needs a GPU. This machine runs the CPU build (whose ranks are
    processes on CPU cores, so it has no such limit): the machine is described to the resolution
    the way the launcher describes a GPU host, with the GPUs CUDA_VISIBLE_DEVICES lists."""
    from serving.launcher import visible_gpus
    from serving.settings import Context

    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SERVING_MODEL_DIR": str(tmp_path), **env}
    ctx = Context(gpus=lambda: visible_gpus(env), gpu_build=True)
    with pytest.raises(resolve.ConfigError) as e:
        resolve.resolve(env, vllm_args, ctx)
    assert str(e.value).startswith("tensor_parallel_size from env ")
    assert "is more than the 2 visible GPU(s); allowed: 1 to 2, or max" in str(e.value)
    ok = resolve.resolve({**env, "OPTION_TENSOR_PARALLEL_SIZE": "2"}, vllm_args, ctx)
    assert ok.settings.tensor_parallel_size == 2


# -- generated ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_args():
    from serving.vllm_args import VllmArgs
    return VllmArgs()


def _refused(env: dict, tmp, vllm_args) -> str:
    with pytest.raises(resolve.ConfigError) as e:
        plan({"SERVING_MODEL_DIR": str(tmp), **env}, vllm_args)
    line = str(e.value)
    assert "\n" not in line
    return line


KEY = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=30).filter(lambda k: k.strip("_"))


@GENERATED
@given(key=KEY, value=st.text(alphabet="abc019-_.", max_size=8), prefix=st.sampled_from(["OPTION_", "SM_VLLM_"]))
def test_generated_unknown_key_is_named(vllm_args, tmp_path_factory, key, value, prefix):
    from serving.settings import BY_KEY
    if key in BY_KEY or vllm_args.flag_for(key) is not None:
        key += "_zz"
    line = _refused({prefix + key.upper(): value}, tmp_path_factory.getbasetemp(), vllm_args)
    assert line.startswith(key + " from env " + prefix + key.upper())


INT_KEYS = ["OPTION_MAX_MODEL_LEN", "OPTION_MAX_ROLLING_BATCH_SIZE", "MAX_BATCH_PREFILL_TOKENS", "OPTION_PORT",
            "OPTION_SHUTDOWN_TIMEOUT", "OPTION_MAX_REQUEST_BYTES"]


@GENERATED
@given(name=st.sampled_from(INT_KEYS), raw=st.text(max_size=12))
def test_generated_non_integer_is_named(vllm_args, tmp_path_factory, name, raw):
    try:
        int(raw.strip())
        raw += "x"  # an integer by chance
    except ValueError:
        pass
    line = _refused({name: raw}, tmp_path_factory.getbasetemp(), vllm_args)
    from serving.settings import BY_ENV
    assert line.startswith(BY_ENV[name].key + " from env " + name)


@GENERATED
@given(raw=st.text(max_size=10).filter(lambda s: s.strip().lower() not in
                                       ("true", "false", "1", "0", "yes", "no", "on", "off")))
def test_generated_non_boolean_is_named(vllm_args, tmp_path_factory, raw):
    line = _refused({"OPTION_TRUST_REMOTE_CODE": raw}, tmp_path_factory.getbasetemp(), vllm_args)
    assert line.startswith("trust_remote_code from env OPTION_TRUST_REMOTE_CODE")
