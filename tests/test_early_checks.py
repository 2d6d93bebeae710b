"""Values vLLM checks only at server start or after loading (serving/early_checks.py) stop the dry run at once: exit 2,
one line naming the key as the user wrote it, the value, and the allowed values from vLLM's own registries. No
engine is started; the launcher's main() runs in this process, and the issue's example as a real subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def dry_run(tmp_path, launcher_main):
    """Run the dry run with env on the embedded model; give (status, the one error line or None, stdout)."""
    def run(env: dict[str, str]):
        rc, out, err = launcher_main({"SERVING_MODEL_DIR": str(tmp_path / "model"), **env}, ["--dry-run"])
        errors = [l for l in err.splitlines() if l.startswith("configuration error:")]
        assert len(errors) <= 1, err
        return rc, errors[0] if errors else None, out
    (tmp_path / "model").mkdir()
    return run


def test_the_issues_example_exits_2_with_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_VLLM_", "HF_MODEL"))}
    env.update(OPTION_ENABLE_AUTO_TOOL_CHOICE="true", OPTION_TOOL_CALL_PARSER="nosuch")
    r = subprocess.run([sys.executable, "-m", "serving", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    errors = [l for l in r.stderr.splitlines() if l.startswith("configuration error:")]
    assert r.returncode == 2 and r.stdout == "" and len(errors) == 1, r.stderr[-2000:]
    assert errors[0].startswith("configuration error: tool_call_parser from env OPTION_TOOL_CALL_PARSER: 'nosuch' "
                                "is not a tool-call parser of vLLM (allowed: "), errors[0]
    assert "hermes" in errors[0] and "qwen3_coder" in errors[0] and "Traceback" not in r.stderr


@pytest.mark.parametrize("env,starts,contains", [
    ({"OPTION_REASONING_PARSER": "nosuch"}, "reasoning_parser from env OPTION_REASONING_PARSER: 'nosuch' is not a "
     "reasoning parser of vLLM", ("qwen3", "deepseek_r1")),
    ({"OPTION_TOOL_CALL_PARSER": "nosuch"}, "tool_call_parser from env OPTION_TOOL_CALL_PARSER: 'nosuch'", ("hermes",)),
    ({"OPTION_ENABLE_AUTO_TOOL_CHOICE": "true"}, "enable_auto_tool_choice from env OPTION_ENABLE_AUTO_TOOL_CHOICE: "
     "--enable-auto-tool-choice requires --tool-call-parser", ()),
    ({"OPTION_CHAT_TEMPLATE": "/nonexistent/template.jinja"}, "chat_template from env OPTION_CHAT_TEMPLATE: The "
     "supplied chat template string (/nonexistent/template.jinja) appears path-like, but doesn't exist!", ()),
    ({"OPTION_CHAT_TEMPLATE": "/"}, "chat_template from env OPTION_CHAT_TEMPLATE: / is not a readable file", ()),
    ({"OPTION_CHAT_TEMPLATE": "{% if messages %}{{ messages[0]['content'] }"}, "chat_template from env "
     "OPTION_CHAT_TEMPLATE: inline chat template does not parse as Jinja", ()),
    ({"OPTION_SPECULATIVE_CONFIG": '{"method": "nosuch", "num_speculative_tokens": 2}'}, "speculative_config from env "
     "OPTION_SPECULATIVE_CONFIG: method 'nosuch' is not a speculative decoding method of vLLM", ("ngram", "eagle3")),
    ({"OPTION_ENABLE_LORA": "true", "OPTION_LORA_MODULES": "ad=/nonexistent/adapter"}, "lora_modules from env "
     "OPTION_LORA_MODULES: LoRA module ad: folder /nonexistent/adapter does not exist", ()),
    ({"OPTION_QUANTIZE": "fp9"}, "quantization from env OPTION_QUANTIZE: 'fp9' is not one of vLLM's quantization "
     "methods", ("fp8", "awq")),
    ({"OPTION_ATTENTION_BACKEND": "nosuch"}, "attention_backend from env OPTION_ATTENTION_BACKEND: 'nosuch' is not one "
     "of vLLM's attention backends", ("FLASH_ATTN",)),
    ({"OPTION_TOKENIZER": "/nonexistent/tokenizer"}, "tokenizer from env OPTION_TOKENIZER: folder "
     "/nonexistent/tokenizer does not exist", ()),
    ({"OPTION_TOOL_CALL_PARSER": "mine", "OPTION_TOOL_PARSER_PLUGIN": "./no_such_plugin.py"}, "tool_parser_plugin from "
     "env OPTION_TOOL_PARSER_PLUGIN: file ./no_such_plugin.py does not exist", ()),
], ids=["reasoning-parser", "tool-parser-without-auto-choice", "auto-choice-without-parser", "template-path",
        "template-folder", "template-inline", "speculative-method", "lora-path", "quantization", "attention-backend",
        "tokenizer-path", "plugin-path"])
def test_a_late_checked_value_exits_2_naming_the_key(dry_run, env, starts, contains):
    rc, line, out = dry_run(env)
    assert rc == 2 and out == "" and line is not None
    assert line.startswith("configuration error: " + starts), line
    for allowed in contains:
        assert allowed in line, line


def test_the_properties_file_names_its_line(tmp_path, launcher_main):
    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text("option.tool_call_parser=nosuch\n")
    rc, out, err = launcher_main({"SERVING_MODEL_DIR": str(model)}, ["--dry-run"])
    assert rc == 2 and f"configuration error: tool_call_parser from {model / 'serving.properties'}:1: 'nosuch'" in err


def test_good_values_pass(dry_run, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    rc, line, out = dry_run({
        "OPTION_ENABLE_AUTO_TOOL_CHOICE": "true", "OPTION_TOOL_CALL_PARSER": "hermes",
        "OPTION_REASONING_PARSER": "qwen3", "OPTION_CHAT_TEMPLATE": str(template),
        "OPTION_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}',
        "OPTION_ENABLE_LORA": "true", "OPTION_LORA_MODULES": f"ad={adapter} hub=org/some-adapter",
        "OPTION_ATTENTION_BACKEND": "auto"})
    assert rc == 0 and line is None, line
    assert "--tool-call-parser hermes" in out.splitlines()[-1]
    for env in ({"OPTION_CHAT_TEMPLATE": "template_chatml.jinja"},  # one of vLLM's bundled templates
                {"OPTION_CHAT_TEMPLATE": "{{ messages[0]['content'] }}"},
                {"OPTION_QUANTIZE": "fp8", "OPTION_ATTENTION_BACKEND": "flash_attn"}):
        rc, line, _ = dry_run(env)
        assert rc == 0 and line is None, (env, line)


def test_a_parser_plugin_may_register_the_name(dry_run, tmp_path):
    """vLLM imports the plugin at start, which may register the name: the launcher leaves that name to vLLM."""
    plugin = tmp_path / "my_parser.py"
    plugin.write_text("# registers its parser with vLLM's ToolParserManager when vLLM imports it\n")
    rc, line, _ = dry_run({"OPTION_ENABLE_AUTO_TOOL_CHOICE": "true", "OPTION_TOOL_CALL_PARSER": "my_parser",
                           "OPTION_TOOL_PARSER_PLUGIN": str(plugin)})
    assert rc == 0 and line is None, line
    rc, line, _ = dry_run({"OPTION_REASONING_PARSER": "mine", "OPTION_REASONING_PARSER_PLUGIN": str(plugin)})
    assert rc == 0 and line is None, line


def test_a_lora_folder_without_an_adapter_config_is_named(dry_run, tmp_path):
    (tmp_path / "not-an-adapter").mkdir()
    rc, line, _ = dry_run({"OPTION_ENABLE_LORA": "true",
                           "OPTION_LORA_MODULES": f'[{{"name": "x", "path": "{tmp_path / "not-an-adapter"}"}}]'})
    assert rc == 2 and line.endswith(f"LoRA module x: {tmp_path / 'not-an-adapter'} holds no adapter_config.json "
                                     "(not a LoRA adapter)"), line
