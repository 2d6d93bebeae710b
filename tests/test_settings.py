"""The settings model: every convention's names, precedence, typing, pass-through, errors, masking.

These call the launcher's planning code with the installed vLLM's real argument
parser; one dry run runs `python -m serving --dry-run` as users would, the others call its main().
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from serving import launcher, resolve
from serving.settings import SETTINGS, Settings, markdown_table, value_type
from tools.launcher_process import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    return d


def plan(va, model_dir, env=None, props: str | None = None):
    if props is not None:
        (model_dir / "serving.properties").write_text(props)
    return launcher.plan({"SERVING_MODEL_DIR": str(model_dir), **(env or {})}, va)


def argv_value(p, flag):
    a = p.argv
    return a[a.index(flag) + 1] if flag in a else None


ENGINE = ["-m", "vllm.entrypoints.cli.main", "serve"]  # `vllm serve`, its model the positional argument after it


def served_model(p):
    assert p.argv[1:4] == ENGINE and "--model" not in p.argv, p.argv
    return p.argv[4]


@pytest.mark.parametrize("name,flag,value", [
    ("OPTION_TENSOR_PARALLEL_DEGREE", "--tensor-parallel-size", "2"),
    ("OPTION_TENSOR_PARALLEL_SIZE", "--tensor-parallel-size", "2"),
    ("SM_NUM_GPUS", "--tensor-parallel-size", "2"),
    ("SM_VLLM_TENSOR_PARALLEL_SIZE", "--tensor-parallel-size", "2"),
    ("OPTION_MAX_ROLLING_BATCH_SIZE", "--max-num-seqs", "16"),
    ("MAX_BATCH_SIZE", "--max-num-seqs", "16"),
    ("OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS", "--max-num-batched-tokens", "4096"),
    ("MAX_BATCH_PREFILL_TOKENS", "--max-num-batched-tokens", "4096"),
    ("OPTION_QUANTIZE", "--quantization", "fp8"),
    ("HF_MODEL_QUANTIZE", "--quantization", "fp8"),
    ("HF_MODEL_REVISION", "--revision", "main"),
    ("OPTION_MAX_MODEL_LEN", "--max-model-len", "1024"),
    ("SM_VLLM_MAX_MODEL_LEN", "--max-model-len", "1024"),
    ("OPTION_DTYPE", "--dtype", "bfloat16"),
    ("OPTION_GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization", "0.85"),
    ("OPTION_MOE_BACKEND", "--moe-backend", "triton"),
    ("SM_VLLM_MOE_BACKEND", "--moe-backend", "triton"),
    ("OPTION_PORT", "--port", "9000"),
    ("SAGEMAKER_BIND_TO_PORT", "--port", "9000"),
])
def test_every_convention_maps_to_its_flag(va, model_dir, name, flag, value):
    p = plan(va, model_dir, {name: value})
    assert argv_value(p, flag) == value
    key = next(k for k, r in p.resolved.items() if r.flag == flag)
    assert p.resolved[key].source == f"env {name}"


@pytest.mark.parametrize("key", ["tensor_parallel_degree", "tensor_parallel_size", "model"])
def test_properties_aliases(va, model_dir, key):
    value = "org/some-model" if key == "model" else "4"
    p = plan(va, model_dir, props=f"engine=Python\noption.{key}={value}\n")
    assert (served_model(p) if key == "model" else argv_value(p, "--tensor-parallel-size")) == value


def test_lmi_engine_line_is_accepted(va, model_dir):
    p = plan(va, model_dir, {"OPTION_ENGINE": "Python"}, props="engine=Python\noption.rolling_batch=vllm\n")
    assert p.resolved["engine"].source == "env OPTION_ENGINE"
    assert not any("engine" in a or "rolling" in a for a in p.argv[3:])


@pytest.mark.parametrize("name", ["OPTION_FP8_MOE_STOCK_ORDER", "LMI_FP8_MOE_STOCK_ORDER"])
def test_stock_moe_order_switch_reaches_the_engine_environment(va, model_dir, name):
    assert plan(va, model_dir, {name: "true"}).env["LMI_FP8_MOE_STOCK_ORDER"] == "1"
    assert plan(va, model_dir, {name: "off"}).env["LMI_FP8_MOE_STOCK_ORDER"] == "0"
    with pytest.raises(resolve.ConfigError, match=f"fp8_moe_stock_order from env {name}: 'sometimes' is not a boolean"):
        plan(va, model_dir, {name: "sometimes"})


# Patches 0006, 0007 and 0014: each switch's setting, its two names, a true and a false spelling, a value refused
SWITCHES = [("fp8_moe_one_launch_quant", "LMI_FP8_MOE_ONE_LAUNCH_QUANT", "on", "false", "maybe"),
            ("moe_one_pass_topk", "LMI_MOE_ONE_PASS_TOPK", "true", "off", "maybe"),
            ("cuda_graph_profile_all", "LMI_CUDA_GRAPH_PROFILE_ALL", "true", "off", "all")]


@pytest.mark.parametrize("setting, engine_env, yes, no, bad", SWITCHES)
@pytest.mark.parametrize("option", [True, False])
def test_a_patch_switch_reaches_the_engine_environment(va, model_dir, setting, engine_env, yes, no, bad, option):
    """A patch's switch, under its OPTION_ and its LMI_ name: normalized for the engine, absent unless set, refused
    at start when it is not a boolean (the patch itself would only see it when its code first runs)."""
    name = f"OPTION_{setting.upper()}" if option else engine_env
    assert plan(va, model_dir, {name: yes}).env[engine_env] == "1"
    assert plan(va, model_dir, {name: no}).env[engine_env] == "0"
    assert engine_env not in plan(va, model_dir, {}).env
    with pytest.raises(resolve.ConfigError, match=f"{setting} from env {name}: '{bad}' is not a boolean"):
        plan(va, model_dir, {name: bad})


@pytest.mark.parametrize("name", ["OPTION_FLASH_ATTN_GRAPH_SPLIT_TOKENS", "LMI_FLASH_ATTN_GRAPH_SPLIT_TOKENS"])
def test_graph_split_tokens_reach_the_engine_environment(va, model_dir, name):
    """Patch 0015's bound: the patch's own unless set, passed on as a count, refused at start when not one."""
    assert plan(va, model_dir, {name: "0"}).env["LMI_FLASH_ATTN_GRAPH_SPLIT_TOKENS"] == "0"
    assert plan(va, model_dir, {name: "256"}).env["LMI_FLASH_ATTN_GRAPH_SPLIT_TOKENS"] == "256"
    assert "LMI_FLASH_ATTN_GRAPH_SPLIT_TOKENS" not in plan(va, model_dir, {}).env
    with pytest.raises(resolve.ConfigError, match=f"flash_attn_graph_split_tokens from env {name}"):
        plan(va, model_dir, {name: "-1"})


def test_hf_model_id_is_the_model(va, model_dir):
    p = plan(va, model_dir, {"HF_MODEL_ID": "Qwen/Qwen3-235B-A22B-FP8"})
    assert served_model(p) == "Qwen/Qwen3-235B-A22B-FP8"
    assert p.model_source == "hub"


def test_env_wins_over_file_and_report_says_so(va, model_dir):
    p = plan(va, model_dir, {"OPTION_MAX_MODEL_LEN": "512"}, props="option.max_model_len=1024\n")
    assert argv_value(p, "--max-model-len") == "512"
    text = "\n".join(launcher.report(p))
    assert "env OPTION_MAX_MODEL_LEN overrides" in text and "serving.properties:1 (max_model_len=1024)" in text


def test_file_wins_over_default(va, model_dir):
    p = plan(va, model_dir, props="option.port=7000\n")
    assert argv_value(p, "--port") == "7000"
    assert p.resolved["port"].overridden[0].source == "default"


def test_option_name_beats_tgi_name(va, model_dir):
    p = plan(va, model_dir, {"SM_NUM_GPUS": "8", "OPTION_TENSOR_PARALLEL_DEGREE": "2"})
    assert argv_value(p, "--tensor-parallel-size") == "2"
    assert [c.source for c in p.resolved["tensor_parallel_size"].overridden] == ["env SM_NUM_GPUS"]


def test_canonical_key_beats_alias_in_one_file(va, model_dir):
    p = plan(va, model_dir, props="option.tensor_parallel_degree=2\noption.tensor_parallel_size=4\n")
    assert argv_value(p, "--tensor-parallel-size") == "4"


def test_tp_max_counts_visible_gpus(va, model_dir):
    p = plan(va, model_dir, {"OPTION_TENSOR_PARALLEL_DEGREE": "max", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert argv_value(p, "--tensor-parallel-size") == "8"


def test_tp_max_without_gpus_is_an_error(va, model_dir):
    with pytest.raises(resolve.ConfigError, match="tensor_parallel_size from env SM_NUM_GPUS: 'max' needs"):
        plan(va, model_dir, {"SM_NUM_GPUS": "max", "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("raw,expect", [("true", ["--enforce-eager"]), ("TRUE", ["--enforce-eager"]),
                                        ("1", ["--enforce-eager"]), ("false", ["--no-enforce-eager"]),
                                        ("no", ["--no-enforce-eager"])])
def test_booleans_both_ways(va, model_dir, raw, expect):
    p = plan(va, model_dir, {"OPTION_ENFORCE_EAGER": raw})
    assert [a for a in p.argv if "enforce-eager" in a] == expect


def test_declared_boolean(va, model_dir):
    p = plan(va, model_dir, {"HF_MODEL_TRUST_REMOTE_CODE": "true", "OPTION_ENABLE_EXPERT_PARALLEL": "false"})
    assert "--trust-remote-code" in p.argv and "--no-enable-expert-parallel" in p.argv


def test_json_and_list_values_pass_through(va, model_dir):
    p = plan(va, model_dir, {"SM_VLLM_HF_OVERRIDES": '{"rope_theta": 10000}',
                             "OPTION_SERVED_MODEL_NAME": '["qwen", "default"]',
                             "OPTION_COMPILATION_CONFIG": '{"mode": 0}'})
    assert argv_value(p, "--hf-overrides") == '{"rope_theta": 10000}'
    i = p.argv.index("--served-model-name")
    assert p.argv[i + 1:i + 3] == ["qwen", "default"]
    assert argv_value(p, "--compilation-config") == '{"mode": 0}'


def test_pass_through_of_an_undeclared_vllm_argument(va, model_dir):
    p = plan(va, model_dir, {"OPTION_MAX_LOGPROBS": "7"}, props="option.enable_prefix_caching=false\n")
    assert argv_value(p, "--max-logprobs") == "7"
    assert "--no-enable-prefix-caching" in p.argv
    assert p.resolved["max_logprobs"].source == "env OPTION_MAX_LOGPROBS"


@pytest.mark.parametrize("env,props,match", [
    ({"OPTION_MAX_MODEL_LENN": "5"}, None, r"max_model_lenn from env OPTION_MAX_MODEL_LENN: unknown setting.*did you mean: max_model_len"),
    ({}, "option.max_rolling_batch_sise=4\n", r"max_rolling_batch_sise from .*serving.properties:1: unknown.*max_rolling_batch_size"),
    ({}, "max_model_len=4\n", r"max_model_len from .*serving.properties:1: unknown top-level key.*option.max_model_len"),
    ({"OPTION_MAX_NUM_SEQS": "abc"}, None, r"max_num_seqs from env OPTION_MAX_NUM_SEQS: 'abc' is not an integer"),
    ({"OPTION_ENFORCE_EAGER": "maybe"}, None, r"enforce_eager from env OPTION_ENFORCE_EAGER: 'maybe' is not a boolean \(allowed"),
    ({"SM_VLLM_MOE_BACKEND": "tritn"}, None, r"moe_backend from env SM_VLLM_MOE_BACKEND: .*invalid choice.*'triton'"),
    ({"OPTION_GPU_MEMORY_UTILIZATION": "most"}, None, r"gpu_memory_utilization from env OPTION_GPU_MEMORY_UTILIZATION: .*invalid float"),
    ({"SM_VLLM_COMPILATION_CONFIG": "{not json"}, None, r"compilation_config from env SM_VLLM_COMPILATION_CONFIG: .*Invalid JSON"),
    ({"OPTION_SPECULATIVE_CONFIG": "{bad"}, None, r"speculative_config from env OPTION_SPECULATIVE_CONFIG: .*cannot be converted"),
    ({"SERVING_MAX_REQUEST_BYTES": "0"}, None, r"max_request_bytes from env SERVING_MAX_REQUEST_BYTES: '0' must be a positive integer"),
    ({}, "engine=MPI\n", r"engine from .*serving.properties:1: 'MPI' is not supported here; allowed: python"),
    ({"OPTION_ROLLING_BATCH": "lmi-dist"}, None, r"rolling_batch from env OPTION_ROLLING_BATCH: 'lmi-dist' is not supported"),
    ({"OPTION_MODEL_ID": "/no/such/folder"}, None, r"model_id from env OPTION_MODEL_ID: local folder /no/such/folder does not exist"),
])
def test_errors_name_key_source_and_what_is_allowed(va, model_dir, env, props, match):
    with pytest.raises(resolve.ConfigError, match=match):
        plan(va, model_dir, env, props)


def test_secrets_are_masked_and_kept_off_argv(va, model_dir):
    p = plan(va, model_dir, {"HF_TOKEN": "hf_SECRET123", "OPTION_API_KEY": "sk-SECRET456"})
    shown = "\n".join(launcher.report(p)) + launcher.command_line(p)
    assert "SECRET" not in shown
    assert "hf_SECRET123" not in p.argv
    assert not any("SECRET" in a for a in p.argv)
    # The engine still gets them, through its environment.
    assert (p.env["HF_TOKEN"], p.env["VLLM_API_KEY"]) == ("hf_SECRET123", "sk-SECRET456")


@pytest.mark.parametrize("name,secret", [("hf_token", True), ("api_key", True), ("AWS_SECRET_ACCESS_KEY", True),
                                         ("AWS_SESSION_TOKEN", True), ("max_num_batched_tokens", False),
                                         ("long_prefill_token_threshold", False), ("return_tokens_as_token_ids", False),
                                         ("allow_credentials", False)])
def test_which_names_count_as_secret(name, secret):
    from serving.settings import looks_secret
    assert looks_secret(name) is secret


def test_model_sources(va, model_dir, tmp_path):
    assert plan(va, model_dir).model_source == "embedded"
    (model_dir / "config.json").write_text("{}")
    p = plan(va, model_dir)
    assert (p.model_source, p.model_path) == ("model-dir", str(model_dir))
    local = tmp_path / "local"
    local.mkdir()
    p = plan(va, model_dir, {"OPTION_MODEL_ID": str(local)})
    assert (p.model_source, p.model_path) == ("local", str(local))
    p = plan(va, model_dir, {"HF_MODEL_ID": "s3://bucket/models/qwen", "SERVING_DOWNLOAD_DIR": str(tmp_path / "dl")})
    assert (p.model_source, p.s3_url, p.model_path) == ("s3", "s3://bucket/models/qwen", str(tmp_path / "dl"))


def test_engine_command_shape(va, model_dir):
    p = plan(va, model_dir)
    assert p.argv[0] == sys.executable and p.argv[1:4] == ENGINE
    assert served_model(p) == p.model_path and p.argv[5].startswith("--")
    assert argv_value(p, "--port") == "8080" and argv_value(p, "--host") == "0.0.0.0"
    assert argv_value(p, "--middleware") == launcher.LMI_MIDDLEWARE
    assert p.env["VLLM_TUNED_CONFIG_FOLDER"] == str(ROOT / "configs")
    assert "--api-server-count" not in p.argv and "api_server_count" not in p.resolved


@pytest.mark.parametrize("env,count,why", [
    ({}, "4", "GPU build: four API server processes"),
    ({"OPTION_API_SERVER_COUNT": "2"}, "2", None),
    ({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}, "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING: vLLM loads adapters"),
    ({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "yes"}, "4", "GPU build"),  # vLLM reads only 1 and true as on
    ({"OPTION_DATA_PARALLEL_SIZE": "2"}, "1", "data parallelism: one API server"),
    ({"SM_VLLM_DATA_PARALLEL_SIZE_LOCAL": "2", "OPTION_DATA_PARALLEL_HYBRID_LB": "true"}, "1", "data parallelism"),
    ({"OPTION_DATA_PARALLEL_SIZE": "2", "OPTION_API_SERVER_COUNT": "2"}, "2", None),
    ({"OPTION_DATA_PARALLEL_SIZE": "2", "OPTION_HEADLESS": "true"}, None, None),
])
def test_the_gpu_build_runs_four_api_servers_unless_told_otherwise(va, model_dir, gpu_build, env, count, why):
    """Four API server processes on the GPU build; one under data parallelism (`vllm serve` would start one per
    rank) and where vLLM loads adapters at run time (it refuses more there); the user's count, or headless, wins."""
    p = plan(va, model_dir, env)
    assert argv_value(p, "--api-server-count") == count
    source = p.resolved["api_server_count"].source if "api_server_count" in p.resolved else None
    if why:
        assert source.startswith(f"default ({why}")
    else:
        assert source is None or not source.startswith("default"), source


def test_the_cpu_build_keeps_vllms_one_api_server(va, model_dir):
    assert "--api-server-count" not in plan(va, model_dir).argv
    assert argv_value(plan(va, model_dir, {"OPTION_DATA_PARALLEL_SIZE": "2"}), "--api-server-count") == "1"


def test_every_declared_flag_exists_in_installed_vllm(va):
    for s in SETTINGS:
        if s.flag:
            assert va.flag_for(s.flag.lstrip("-").replace("-", "_")) == s.flag, s.key


def test_list_settings_prints_the_table_without_vllm():
    code = "import sys; from serving.launcher import main; rc = main(['--list-settings']); " \
           "assert 'vllm' not in sys.modules, 'vllm imported'; sys.exit(rc)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, markdown_table() + "\n"), r.stderr[-2000:]


def test_settings_reference_is_generated_from_the_table():
    """docs/settings.md is the generator's output, every setting has a row there, and each why is in its section."""
    from serving import settings_doc

    page = settings_doc.PAGE.read_text() if settings_doc.PAGE.exists() else ""
    assert page == settings_doc.page(), f"docs/settings.md is stale: run `{settings_doc.COMMAND}`"
    for s in SETTINGS:
        assert f"\n| `{s.key}` | " in page, s.key
        if s.why:
            assert f"[Why?](#{s.key})" in page and f"\n### {s.key}\n" in page, s.key


def test_help_texts_are_short_and_name_no_measurement():
    """--list-settings and --help show what a setting does and when to change it; the reasons and figures behind a
    default are its `why`, on docs/settings.md only."""
    import re

    figure = re.compile(r"\b(run|probe) \d|RESULTS|\d\.\d+x|\d µs|\d ms\b|\d s\b")
    wrong = [f"{s.key}: {len(s.help)} characters" for s in SETTINGS if len(s.help) > 400]
    wrong += [f"{s.key}: {m[0]!r} in its help" for s in SETTINGS if (m := figure.search(s.help))]
    wrong += [f"{s.key}: {m[0]!r} in its why" for s in SETTINGS if (m := re.search(r"\b(run|probe) \d", s.why))]
    assert not wrong, wrong


def test_settings_class_is_built_from_the_table():
    """Settings comes from the table: one field per row, in its order, typed as its parser returns (or None without
    a default), the row's default, secrets out of repr; a row added to the table is a field, nothing else to write."""
    from serving.settings import Setting, parse_positive_int, settings_class

    fields = dataclasses.fields(Settings)
    hints = typing.get_type_hints(Settings)
    assert [f.name for f in fields] == [s.key for s in SETTINGS], "Settings' fields are not the table's keys"
    wrong = []
    for f, s in zip(fields, SETTINGS):
        if hints[f.name] != value_type(s):
            wrong.append(f"{f.name}: type {hints[f.name]}, the table says {value_type(s)}")
        if f.default_factory is not dataclasses.MISSING or type(f.default) is not type(s.default) \
                or f.default != s.default:
            wrong.append(f"{f.name}: default {f.default!r}, the table says {s.default!r}")
        if f.repr == s.secret:
            wrong.append(f"{f.name}: repr={f.repr}, the table says secret={s.secret}")
    assert not wrong, wrong
    assert Settings.__dataclass_params__.frozen and not hasattr(Settings(), "__dict__"), "frozen, slots"
    assert Settings.__module__ == "serving.settings" and Settings.__qualname__ == "Settings"
    assert "hf_token" in {f.name for f in fields} and "hf_DRYRUN" not in repr(Settings(hf_token="hf_DRYRUN"))

    grown = settings_class((*SETTINGS, Setting("new_limit", "A limit.", parse=parse_positive_int, default=4)))
    new = dataclasses.fields(grown)[-1]
    assert (new.name, typing.get_type_hints(grown)["new_limit"], new.default) == ("new_limit", int, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        grown().new_limit = 5


def _dry_run(env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_VLLM_", "HF_"))}
    env.update({"SERVING_MODEL_DIR": str(tmp_path), **env_extra})
    return subprocess.run([sys.executable, "-m", "serving", "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_dry_run_prints_sources_and_the_exact_command(tmp_path):
    r = _dry_run({"OPTION_MAX_ROLLING_BATCH_SIZE": "24", "HF_TOKEN": "hf_DRYRUNSECRET"}, tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip().splitlines()
    assert "setting max_num_seqs=24  [env OPTION_MAX_ROLLING_BATCH_SIZE; vLLM --max-num-seqs]" in out
    assert "setting hf_token=****  [env HF_TOKEN; launcher]" in out
    assert "DRYRUNSECRET" not in r.stdout + r.stderr
    last = shlex.split(out[-1])
    assert last[1:4] == ENGINE and "--max-num-seqs" in last


def test_bad_value_stops_with_exit_2_and_one_line(tmp_path, launcher_main):
    rc, out, err = launcher_main({"SERVING_MODEL_DIR": str(tmp_path), "OPTION_MAX_NUM_SEQS": "lots",
                                  "HF_TOKEN": "hf_NOTPRINTED"}, ["--dry-run"])
    assert rc == 2
    errors = [l for l in err.splitlines() if l.startswith("configuration error")]
    assert errors == ["configuration error: max_num_seqs from env OPTION_MAX_NUM_SEQS: 'lots' is not an integer"]
    assert "NOTPRINTED" not in out + err


# -- precedence, context defaults, the typed settings object -------------------------------------

def test_precedence_levels_and_names(va, model_dir):
    # The embedded model's context default loses to the file, which loses to the environment.
    assert plan(va, model_dir).resolved["max_model_len"].source == "default (embedded tiny model)"
    p = plan(va, model_dir, props="option.max_model_len=1024\n")
    assert (p.settings.max_model_len, p.resolved["max_model_len"].source) == (1024, f"{model_dir}/serving.properties:1")
    assert plan(va, model_dir, {"SM_VLLM_MAX_MODEL_LEN": "512"}).settings.max_model_len == 512
    # Within the environment: OPTION_<KEY> > OPTION_<ALIAS> > SM_VLLM_<FLAG> > the other conventions' names.
    env = {"NUM_SHARD": "1", "SM_NUM_GPUS": "1", "TENSOR_PARALLEL_DEGREE": "1", "SM_VLLM_TENSOR_PARALLEL_SIZE": "2",
           "OPTION_TENSOR_PARALLEL_DEGREE": "3", "OPTION_TENSOR_PARALLEL_SIZE": "4"}
    order = []
    while env:
        p = plan(va, model_dir, env)
        won = p.resolved["tensor_parallel_size"].source.removeprefix("env ")
        order.append(won)
        env.pop(won)
    assert order == ["OPTION_TENSOR_PARALLEL_SIZE", "OPTION_TENSOR_PARALLEL_DEGREE", "SM_VLLM_TENSOR_PARALLEL_SIZE",
                     "TENSOR_PARALLEL_DEGREE", "SM_NUM_GPUS", "NUM_SHARD"]
    assert order == list(resolve.TABLE["tensor_parallel_size"].env_names), "the table lists names strongest first"


def test_cpu_kv_cache_default_is_a_source_the_user_overrides(va, model_dir):
    assert launcher.is_cpu_build()
    r = plan(va, model_dir).resolved["kv_cache_memory_bytes"]
    assert (r.raw, r.source) == ("268435456", "default (CPU build)")
    p = plan(va, model_dir, {"OPTION_KV_CACHE_MEMORY_BYTES": "1073741824"})
    assert argv_value(p, "--kv-cache-memory-bytes") == "1073741824"
    p = plan(va, model_dir, {"OPTION_GPU_MEMORY_UTILIZATION": "0.5"})
    assert "--kv-cache-memory-bytes" not in p.argv and argv_value(p, "--gpu-memory-utilization") == "0.5"


def test_settings_object_is_typed_and_frozen(va, model_dir):
    import dataclasses

    p = plan(va, model_dir, {"OPTION_MAX_ROLLING_BATCH_SIZE": "24", "HF_MODEL_TRUST_REMOTE_CODE": "yes",
                             "HF_TOKEN": "hf_REPRSECRET", "OPTION_TENSOR_PARALLEL_DEGREE": "max",
                             "CUDA_VISIBLE_DEVICES": "0,1"})
    s = p.settings
    assert (s.max_num_seqs, s.trust_remote_code, s.port, s.tensor_parallel_size) == (24, True, 8080, 2)
    assert s.model_dir == model_dir and s.revision is None
    with pytest.raises(AttributeError):
        s.max_num_seq  # noqa: B018  (misspelt: an error, not a silent None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 9
    assert "REPRSECRET" not in repr(s)
    assert "tensor_parallel_size=max resolved to 2 visible GPU(s)" in launcher.report(p)


def test_locations_are_read_through_the_table(va, model_dir, tmp_path):
    p = plan(va, model_dir, {"LMI_CACHE_DIR": str(tmp_path / "cache"), "LMI_CONFIGS_DIR": str(ROOT / "configs")})
    assert p.model_path == str(tmp_path / "cache" / "tiny-qwen3-moe")
    assert p.env["VLLM_TUNED_CONFIG_FOLDER"] == str(ROOT / "configs")
    p = plan(va, model_dir, {"LMI_CONFIGS_DIR": str(tmp_path / "none")})
    assert "VLLM_TUNED_CONFIG_FOLDER" not in p.env or p.env["VLLM_TUNED_CONFIG_FOLDER"] == os.environ.get(
        "VLLM_TUNED_CONFIG_FOLDER")
    with pytest.raises(resolve.ConfigError, match=r"model_dir from .*serving.properties:1: a location is set in the "
                                              r"environment only \(SERVING_MODEL_DIR\)"):
        plan(va, model_dir, props="option.model_dir=/elsewhere\n")


def test_entrypoint_uses_the_tables_python_name(tmp_path):
    (name,) = resolve.TABLE["python"].env_names
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_VLLM_", "HF_"))}
    r = subprocess.run([str(ROOT / "entrypoint.sh"), "serve", "--dry-run"], env={**env, name: "/bin/echo"},
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, "-m serving --dry-run\n")


def test_request_limit_has_one_default_and_one_parser():
    from serving.lmi import middleware
    from serving.settings import SettingValueError

    s = resolve.TABLE["max_request_bytes"]
    assert middleware.DEFAULT_MAX_REQUEST_BYTES == s.default and middleware.LIMIT_ENV == s.engine_env
    assert middleware.max_request_bytes({s.engine_env: "4096"}) == 4096
    with pytest.raises(SettingValueError, match=r"SERVING_MAX_REQUEST_BYTES='-1': '-1' must be a positive integer"):
        middleware.max_request_bytes({s.engine_env: "-1"})


def test_to_environment_resolves_back_to_the_same_values(va, model_dir):
    from serving.settings import to_environment

    values = {"tensor_parallel_degree": 2, "max_model_len": 1024, "enforce_eager": True, "trust_remote_code": False,
              "max_request_bytes": 1 << 20}
    env = to_environment(values)
    assert env["OPTION_TENSOR_PARALLEL_SIZE"] == "2" and env["OPTION_ENFORCE_EAGER"] == "true"
    p = plan(va, model_dir, env)
    assert (p.settings.tensor_parallel_size, p.settings.max_model_len, p.settings.trust_remote_code,
            p.settings.max_request_bytes) == (2, 1024, False, 1 << 20)
    assert "--enforce-eager" in p.argv


def test_exit_codes_are_the_documented_ones():
    from serving.exit_codes import ExitCode

    readme = (ROOT / "README.md").read_text()
    assert (ExitCode.CONFIG_ERROR, ExitCode.DOWNLOAD_FAILED, ExitCode.ENGINE_DIED) == (2, 3, 4)
    assert "2 a configuration error" in readme and "3 the model download failed" in readme and "4 the engine died" in readme


# -- the image's HEALTHCHECK: python -m serving --healthcheck -------------------------------------

@pytest.fixture
def ping_server():
    """A loopback HTTP server whose /ping answers the status in `state["status"]`."""
    import http.server
    import threading

    state = {"status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(state["status"] if self.path == "/ping" else 404)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["port"] = srv.server_address[1]
    yield state
    srv.shutdown()
    srv.server_close()


def _healthcheck(env_extra, model_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_VLLM_", "HF_", "SAGEMAKER_"))}
    env.update({"SERVING_MODEL_DIR": str(model_dir), **env_extra})
    code = "import sys; from serving.launcher import main; rc = main(['--healthcheck']); " \
           "print('vllm loaded' if 'vllm' in sys.modules else 'vllm not loaded'); sys.exit(rc)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("how", ["OPTION_PORT", "SAGEMAKER_BIND_TO_PORT", "SM_VLLM_PORT", "serving.properties"])
def test_healthcheck_resolves_the_port_like_the_launcher(ping_server, model_dir, how):
    port = str(ping_server["port"])
    if how == "serving.properties":
        (model_dir / "serving.properties").write_text(f"option.port={port}\n")
        env = {}
    else:
        env = {how: port}
    r = _healthcheck(env, model_dir)
    assert (r.returncode, r.stdout) == (0, "vllm not loaded\n"), r.stderr  # fast: well inside the 10 s timeout


def test_healthcheck_goes_straight_to_the_server_whatever_proxy_the_environment_names(ping_server, model_dir):
    """A container's proxy variables (a proxy that does not answer, no no_proxy) do not reroute the health check."""
    dead = f"http://127.0.0.1:{free_port()}"
    r = _healthcheck({"OPTION_PORT": str(ping_server["port"]), "HTTP_PROXY": dead, "http_proxy": dead,
                      "NO_PROXY": "", "no_proxy": ""}, model_dir)
    assert r.returncode == 0, r.stderr


def test_healthcheck_fails_when_ping_is_not_200_or_nobody_listens(ping_server, model_dir):
    ping_server["status"] = 503
    r = _healthcheck({"OPTION_PORT": str(ping_server["port"])}, model_dir)
    assert r.returncode == 1 and "503" in r.stderr
    r = _healthcheck({"OPTION_PORT": str(free_port())}, model_dir)
    assert r.returncode == 1 and "unhealthy: http://127.0.0.1:" in r.stderr
    r = _healthcheck({"OPTION_PORT": "eighty"}, model_dir)
    assert r.returncode == 1 and "port from env OPTION_PORT: 'eighty' is not an integer" in r.stderr


# -- what LMI's docs, the SageMaker SDK and TGI write: mapped, accepted with a reason, or refused --

# sagemaker.djl_inference.DJLModel with every argument set (its _configure_environment_variables),
# plus the LMI vLLM guide's quick-start and async-mode names.
LMI_SDK_ENV = {
    "HF_MODEL_ID": "org/model", "OPTION_ENGINE": "Python", "HF_TASK": "text-generation",
    "TENSOR_PARALLEL_DEGREE": "max", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SERVING_MIN_WORKERS": "1",
    "SERVING_MAX_WORKERS": "1", "SERVING_JOB_QUEUE_SIZE": "12", "OPTION_PARALLEL_LOADING": "True",
    "OPTION_MODEL_LOADING_TIMEOUT": "1800", "OPTION_PREDICT_TIMEOUT": "60", "HF_TOKEN": "hf_x",
    "OPTION_DTYPE": "fp16", "OPTION_ROLLING_BATCH": "disable", "OPTION_ASYNC_MODE": "true",
    "OPTION_ENTRYPOINT": "djl_python.lmi_vllm.vllm_async_service", "SERVING_FAIL_FAST": "true",
    "OPTION_MAX_ROLLING_BATCH_SIZE": "64", "MAX_CONCURRENT_REQUESTS": "128", "HF_REVISION": "main",
    "HF_MODEL_TRUST_REMOTE_CODE": "true", "OPTION_ENABLE_STREAMING": "true", "SERVING_LOAD_MODELS":
    "test::Python=/opt/ml/model", "OPTION_OUTPUT_FORMATTER": "json",
}
# The SDK's HF LLM (TGI) path and TGI's own launcher names.
TGI_ENV = {
    "HF_MODEL_ID": "org/model", "SM_NUM_GPUS": "2", "MAX_INPUT_LENGTH": "1024", "MAX_TOTAL_TOKENS": "2048",
    "MAX_BATCH_PREFILL_TOKENS": "4096", "MAX_BATCH_TOTAL_TOKENS": "8192", "HUGGING_FACE_HUB_TOKEN": "hf_x",
    "HF_MODEL_QUANTIZE": "fp8", "MESSAGES_API_ENABLED": "true", "CUDA_MEMORY_FRACTION": "0.8", "DTYPE": "bfloat16",
    "HF_MODEL_REVISION": "main", "MAX_CONCURRENT_REQUESTS": "128", "MAX_BEST_OF": "2", "MAX_STOP_SEQUENCES": "4",
    "MAX_TOP_N_TOKENS": "5", "SHARDED": "true", "MAX_BATCH_SIZE": "32",
}


def test_lmi_and_sdk_environment_starts_with_the_meaning_intended(va, model_dir):
    p = plan(va, model_dir, LMI_SDK_ENV)
    assert served_model(p) == "org/model" and argv_value(p, "--revision") == "main"
    assert argv_value(p, "--tensor-parallel-size") == "4" and argv_value(p, "--dtype") == "float16"
    assert argv_value(p, "--max-num-seqs") == "64" and "--trust-remote-code" in p.argv
    notes = [n for n in launcher.report(p) if "no effect here" in n]
    for key in ("model_loading_timeout", "predict_timeout", "min_workers", "max_workers", "job_queue_size",
                "parallel_loading", "task", "engine", "rolling_batch", "async_mode", "entrypoint", "fail_fast",
                "enable_streaming", "load_models"):
        assert sum(n.startswith(f"{key}=") for n in notes) == 1, (key, notes)
    assert "job_queue_size=12 from env SERVING_JOB_QUEUE_SIZE: no effect here: vLLM's scheduler" in "\n".join(notes)


def test_tgi_environment_starts_with_the_meaning_intended(va, model_dir):
    p = plan(va, model_dir, TGI_ENV)
    assert argv_value(p, "--tensor-parallel-size") == "2" and argv_value(p, "--max-model-len") == "2048"
    assert argv_value(p, "--max-num-batched-tokens") == "4096" and argv_value(p, "--quantization") == "fp8"
    assert argv_value(p, "--gpu-memory-utilization") == "0.8" and argv_value(p, "--dtype") == "bfloat16"
    assert argv_value(p, "--max-num-seqs") == "32" and p.env["HF_TOKEN"] == "hf_x"
    notes = "\n".join(n for n in launcher.report(p) if "no effect here" in n)
    for key in ("max_input_tokens", "max_batch_total_tokens", "messages_api_enabled", "max_best_of",
                "max_stop_sequences", "max_top_n_tokens", "sharded", "job_queue_size"):
        assert f"{key}=" in notes, key
    assert "set that instead" in notes  # MAX_INPUT_LENGTH says what to use
    assert "job_queue_size=128 from env MAX_CONCURRENT_REQUESTS: no effect here" in notes


def test_tgi_and_lmi_short_names_map(va, model_dir):
    for env, flag, value in [({"NUM_SHARD": "2"}, "--tensor-parallel-size", "2"),
                             ({"TENSOR_PARALLEL_DEGREE": "2"}, "--tensor-parallel-size", "2"),
                             ({"REVISION": "v1"}, "--revision", "v1"),
                             ({"QUANTIZE": "fp8"}, "--quantization", "fp8"),
                             ({"OPTION_DTYPE": "bf16"}, "--dtype", "bfloat16"),
                             ({"OPTION_DTYPE": "fp32"}, "--dtype", "float32")]:
        assert argv_value(plan(va, model_dir, env), flag) == value, env
    assert served_model(plan(va, model_dir, {"MODEL_ID": "org/m"})) == "org/m"
    assert "--trust-remote-code" in plan(va, model_dir, {"HF_TRUST_REMOTE_CODE": "true"}).argv
    assert argv_value(plan(va, model_dir, {"OPTION_CPU_OFFLOAD_GB_PER_GPU": "4"}), "--cpu-offload-gb") == "4"
    p = plan(va, model_dir, {"SAGEMAKER_MAX_REQUEST_SIZE": "1048576"})
    assert p.env["SERVING_MAX_REQUEST_BYTES"] == "1048576"


def test_lmi_top_level_keys_in_serving_properties(va, model_dir):
    p = plan(va, model_dir, props="engine=Python\nminWorkers=1\nmaxWorkers=1\njob_queue_size=100\n"
                                  "option.entryPoint=djl_python.lmi_vllm.vllm_async_service\noption.rolling_batch=vllm\n")
    notes = "\n".join(launcher.report(p))
    assert "min_workers=1 from" in notes and "job_queue_size=100 from" in notes and "entrypoint=" in notes


@pytest.mark.parametrize("env,props,match", [
    ({"OPTION_ROLLING_BATCH": "lmi-dist"}, None, r"rolling_batch from env OPTION_ROLLING_BATCH: 'lmi-dist' is not "
                                                  r"supported here; allowed: vllm, auto, disable \(this container always "
                                                  r"runs vLLM: use vllm, or leave it unset\)"),
    ({}, "engine=MPI\n", r"engine from .*: 'MPI' is not supported here; allowed: python \(.*engine=Python"),
    ({"OPTION_ENTRYPOINT": "model.py"}, None, r"entrypoint from env OPTION_ENTRYPOINT: 'model.py' is not supported "
                                               r"here.*custom LMI handler"),
    ({"HF_TASK": "text-embedding"}, None, r"task from env HF_TASK: 'text-embedding' .*text generation only"),
    ({"OPTION_DTYPE": "int8"}, None, r"dtype from env OPTION_DTYPE: 'int8' is lmi-dist's .*use option.quantize"),
    ({"OPTION_OUTPUT_FORMATTER": "my_formatter"}, None, r"output_formatter from env OPTION_OUTPUT_FORMATTER: "
                                                         r"'my_formatter' is not supported.*allowed: json, jsonlines"),
])
def test_what_cannot_be_honoured_is_refused_saying_what_to_use(va, model_dir, env, props, match):
    with pytest.raises(resolve.ConfigError, match=match):
        plan(va, model_dir, env, props)


def test_unknown_lmi_server_setting_is_accepted_with_a_line(va, model_dir):
    p = plan(va, model_dir, {"SERVING_CHUNKED_READ_TIMEOUT": "30"})
    assert ("env SERVING_CHUNKED_READ_TIMEOUT: no effect here (an LMI model-server setting this container does "
            "not have)") in launcher.report(p)


def test_every_name_the_conventions_write_is_in_the_table():
    from serving.settings import BY_ENV, BY_KEY

    table = markdown_table()
    for name in {**LMI_SDK_ENV, **TGI_ENV}:
        if name in ("CUDA_VISIBLE_DEVICES",):
            continue
        declared = name in BY_ENV or name.removeprefix("OPTION_").lower() in BY_KEY
        assert declared and f"`{name}`" in table, name


# -- tensor parallelism defaults to every visible GPU ------------------------------------------------

def test_tp_defaults_to_every_visible_gpu_and_says_so(va, model_dir):
    p = plan(va, model_dir)
    assert argv_value(p, "--tensor-parallel-size") == "1"
    assert "setting tensor_parallel_size=1  [default (CPU build: 1); vLLM --tensor-parallel-size]" in launcher.report(p)
    user = resolve.Sources({"SERVING_MODEL_DIR": str(model_dir)}, va).resolve()
    d = launcher.tp_default({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, cpu_build=False)
    assert (d.raw, d.why) == ("8", "every visible GPU: 8, counted by CUDA_VISIBLE_DEVICES")
    d = launcher.tp_default({"CUDA_VISIBLE_DEVICES": ""}, cpu_build=False)
    assert (d.raw, d.why) == ("1", "no GPU visible: 1")
    defaults = launcher.context_defaults("hub", user, {"CUDA_VISIBLE_DEVICES": "0,1"}, cpu_build=False)
    assert [(d.key, d.raw) for d in defaults if d.key == "tensor_parallel_size"] == [("tensor_parallel_size", "2")]
    # A degree the user set is left alone.
    user = resolve.Sources({"SERVING_MODEL_DIR": str(model_dir), "SM_NUM_GPUS": "1"}, va).resolve()
    defaults = launcher.context_defaults("hub", user, {"CUDA_VISIBLE_DEVICES": "0,1"}, cpu_build=False)
    assert [d for d in defaults if d.key == "tensor_parallel_size"] == []


def test_adapters_in_the_model_folder_turn_lora_on(va, model_dir):
    (model_dir / "config.json").write_text("{}")
    for name, rank in (("a", 8), ("b", 32)):
        d = model_dir / "adapters" / name
        d.mkdir(parents=True)
        (d / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA",
                                                            "target_modules": ["q_proj", f"{name}_proj"]}))
    p = plan(va, model_dir)
    assert "--enable-lora" in p.argv and argv_value(p, "--max-lora-rank") == "32"
    i = p.argv.index("--lora-target-modules")
    assert p.argv[i + 1:i + 4] == ["a_proj", "b_proj", "q_proj"]
    i = p.argv.index("--lora-modules")
    assert p.argv[i + 1:i + 3] == [f"a={model_dir}/adapters/a", f"b={model_dir}/adapters/b"]
    assert any(n.startswith("LoRA adapters: a, b") for n in p.notes)
    # The user's own LoRA settings win.
    assert argv_value(plan(va, model_dir, {"OPTION_MAX_LORA_RANK": "64"}), "--max-lora-rank") == "64"
    (model_dir / "adapters" / "b" / "adapter_config.json").write_text("{}")
    with pytest.raises(resolve.ConfigError, match=r"adapters from .*adapters/b/adapter_config.json: not a LoRA "):
        plan(va, model_dir)


def test_lmi_session_names_reach_vllms_sagemaker_hooks(va, model_dir):
    p = plan(va, model_dir)
    assert p.env["SAGEMAKER_ENABLE_STATEFUL_SESSIONS"] == "1"  # on by default, as in LMI
    p = plan(va, model_dir, {"OPTION_ENABLE_STATEFUL_SESSIONS": "false", "OPTION_SESSIONS_EXPIRATION": "3600",
                             "OPTION_SESSIONS_PATH": "/dev/shm/s"})
    assert (p.env["SAGEMAKER_ENABLE_STATEFUL_SESSIONS"], p.env["SAGEMAKER_SESSIONS_EXPIRATION"],
            p.env["SAGEMAKER_SESSIONS_PATH"]) == ("0", "3600", "/dev/shm/s")


@pytest.mark.parametrize("gpu_build_too", [False, True], ids=["cpu-build", "gpu-build"])
def test_the_embedded_model_on_the_gpu_build_warns_that_its_answers_are_noise(tmp_path, launcher_main, monkeypatch,
                                                                              gpu_build_too):
    """No model configured: both builds serve the embedded tiny model (README: `make run`, the CPU image's test). On the
    GPU build it is more likely a model setting that did not arrive, so the start warns that its weights are random
    and names the settings that choose a model and the folder it would be read from."""
    if gpu_build_too:
        monkeypatch.setattr(launcher, "is_cpu_build", lambda: False)
    rc, _, err = launcher_main({"SERVING_MODEL_DIR": str(tmp_path / "none")}, ["--prepare-only"])
    assert rc == 0, err[-2000:]
    assert "no model configured: serving the embedded tiny Qwen3-MoE" in err
    warned = [ln for ln in err.splitlines() if "random weights" in ln]
    assert len(warned) == (1 if gpu_build_too else 0)
    if gpu_build_too:
        assert "WARNING" in warned[0] and "HF_MODEL_ID or OPTION_MODEL_ID" in warned[0]
        assert str(tmp_path / "none") in warned[0]

