"""End to end: the launcher starts the real CPU vLLM engine on the embedded tiny model; /ping and /invocations answer."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from conftest import metric_total

pytestmark = pytest.mark.engine


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, json.loads(r.read())


def test_ping(server):
    with urllib.request.urlopen(server.url + "/ping", timeout=10) as r:
        assert r.status == 200


def test_invocations_openai_completion_body(server):
    status, body = post(server.url + "/invocations", {"prompt": "Hello", "max_tokens": 6, "temperature": 0})
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 6
    assert len(body["choices"][0]["text"]) == 6  # byte-level model, printable ASCII only: one char a token


def test_invocations_lmi_body(server):
    status, body = post(server.url + "/invocations", {"inputs": "Hello", "parameters": {"max_new_tokens": 5,
                                                                                         "do_sample": False}})
    assert status == 200
    assert isinstance(body["generated_text"], str) and len(body["generated_text"]) == 5


def test_startup_log_reports_settings_patches_and_command(server):
    log = server.log()
    assert "no model configured: serving the embedded tiny Qwen3-MoE" in log
    assert "setting port=" in log and "[env OPTION_PORT; vLLM --port]" in log
    assert "vLLM patches applied to 0.32.0:" in log
    # by default vLLM's CLI runs in the launcher's process (engine_in_process), which imported vLLM for the check
    assert "starting engine (in this process): " in log
    assert "--middleware serving.lmi.middleware.LMIMiddleware" in log
    # `vllm serve`, vLLM's supported entry point: no deprecation warning for the api_server module
    assert " -m vllm.entrypoints.cli.main serve " in log and "vllm.entrypoints.openai.api_server" not in log


def test_the_engines_processes_get_the_environment_a_fresh_interpreter_would_give_them(server):
    """vLLM's CLI in the launcher's process hands its spawned processes what importing vLLM sets in the
    environment (as the exec'd interpreter's import set it again): LD_LIBRARY_PATH for OpenCV's libraries,
    PYTORCH_NVML_BASED_CUDA_CHECK and the like, read here from multiprocessing's resource tracker, which vLLM's
    engine start spawns with the API server's environment."""
    import os
    import subprocess
    import sys

    import psutil

    probe = ("import json, os; before = set(os.environ); import vllm.entrypoints.launchers.cli_args; "
             "print(json.dumps(sorted(set(os.environ) - before)))")
    fresh = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}  # before any import set more
    run = subprocess.run([sys.executable, "-c", probe], env=fresh, capture_output=True, text=True, timeout=300,
                         check=True)
    set_by_import = json.loads(run.stdout.strip().splitlines()[-1])
    assert set_by_import, "importing vLLM set nothing: this test checks nothing"
    main = psutil.Process(server.proc.pid)
    trackers = [p for p in main.children(recursive=True) if "resource_tracker" in " ".join(p.cmdline())]
    assert trackers, "no resource tracker among the server's processes"
    assert sorted(set(set_by_import) - set(trackers[0].environ())) == []


def test_engine_in_process_false_execs_vllm_serve_and_serves(adapter_server):
    """engine_in_process=false: the launcher execs `vllm serve` in a fresh interpreter, which serves."""
    log = adapter_server.log()
    assert "starting engine (exec: engine_in_process=false, through serving.engine_cli): " in log
    status, body = post(adapter_server.url + "/invocations", {"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
    assert status == 200 and isinstance(body["generated_text"], str)


def _successes(url: str) -> float:
    """vLLM's finished-request counter as one /metrics answer gives it, summed over its labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return metric_total(r.read().decode(), "vllm:request_success_total")


def test_metrics_count_every_api_server_process_in_each_answer(adapter_server):
    """With several API server processes (the adapter server runs two; the GPU build four) each serves some of the
    requests, and every /metrics answer, whichever process gives it, counts them all (vLLM's multiprocess collector)."""
    url, n = adapter_server.url, 8
    before = _successes(url)
    for i in range(n):
        status, _ = post(url + "/invocations", {"inputs": f"count {i}", "parameters": {"max_new_tokens": 2}})
        assert status == 200
    assert [_successes(url) - before for _ in range(6)] == [n] * 6


def test_startup_log_masks_the_hub_token(server):
    from conftest import PLANTED_SECRET

    log = server.log()
    assert "setting hf_token=****  [env HF_TOKEN; launcher]" in log
    assert PLANTED_SECRET not in log


def _leaks(text: str) -> list[str]:
    from conftest import PLANTED_SECRETS

    return [name for name, value in PLANTED_SECRETS.items() if value in text]


def test_planted_secrets_reach_no_argv_log_or_error_body(server):
    """HF_TOKEN, AWS keys and the api_key setting (planted by conftest) are in none of: every server
    process's argv (/proc/PID/cmdline, which ps and vLLM's own args log show), the server's log,
    the bodies of error answers, after requests that fail in each layer."""
    import psutil
    import urllib.error
    from conftest import PLANTED_SECRETS

    main = psutil.Process(server.proc.pid)
    procs = [main, *main.children(recursive=True)]
    assert len(procs) >= 2, "expected the API server and its engine process"
    for p in procs:
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace")
        assert not _leaks(argv), f"{p.pid} {p.name()} argv holds {_leaks(argv)}"

    bodies = []
    for path, raw, headers in [
        ("/invocations", b'{"inputs": 5}', {}),  # our LMI validation
        ("/invocations", b'{"inputs": "x",', {}),  # not JSON
        ("/invocations", b'{"prompt": "x", "max_tokens": -1}', {}),  # vLLM's validation
        ("/invocations", b'{"inputs": "x", "parameters": {"max_new_tokens": 5000}}', {}),  # past the context
        ("/invocations", b'{"inputs": "' + b"a" * (7 << 20) + b'"}', {}),  # 413
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 2}', {}),  # no key: 401
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 2}', {"Authorization": "Bearer wrong"}),  # wrong key
        ("/no-such-route", b"{}", {}),
    ]:
        req = urllib.request.Request(server.url + path, data=raw, headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                pytest.fail(f"{path} {raw[:40]!r} answered {r.status}")
        except urllib.error.HTTPError as e:
            assert 400 <= e.code < 500, (path, e.code)
            bodies.append(e.read().decode(errors="replace"))
    assert not _leaks("\n".join(bodies)), _leaks("\n".join(bodies))
    # the key is in force (so it reached the engine, through its environment)
    req = urllib.request.Request(server.url + "/v1/models",
                                 headers={"Authorization": "Bearer " + PLANTED_SECRETS["OPTION_API_KEY"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200

    log = server.log()
    assert not _leaks(log), f"the server log holds {_leaks(log)}"


def test_planted_secrets_reach_no_dry_run_or_config_error(tmp_path, launcher_main):
    """--dry-run's report and command, and a configuration error's line, with every secret planted
    (in the environment and as serving.properties options)."""
    from conftest import PLANTED_SECRETS

    (tmp_path / "serving.properties").write_text("option.hf_token=hf_PLANTEDfromPROPERTIES\n")
    env = {**PLANTED_SECRETS, "SERVING_MODEL_DIR": str(tmp_path), "SM_VLLM_API_KEY": "sk-PLANTEDviaSMVLLM"}
    outs = []
    for extra, rc in [({}, 0), ({"OPTION_MAX_MODEL_LEN": "lots"}, 2)]:
        got, out, err = launcher_main({**env, **extra}, ["--dry-run"], drop=("OPTION_", "SM_VLLM_", "HF_", "AWS_"))
        assert got == rc, err[-2000:]
        outs.append(out + err)
    assert "setting api_key=****" in outs[0] and "setting hf_token=****" in outs[0]
    assert "max_model_len" in outs[1]
    text = "\n".join(outs)
    assert not _leaks(text) and "PLANTEDfromPROPERTIES" not in text and "PLANTEDviaSMVLLM" not in text, text


def test_the_launcher_execs_where_the_engines_path_would_shadow_what_it_imported(tmp_path):
    """With engine_in_process, vLLM's CLI runs in the launcher's process only where the engine would import what
    the launcher did: a folder on the engine's path holding a module the launcher imported from elsewhere (here the
    user's code folder with a json.py beside model.py) makes it exec a fresh interpreter instead; so does
    engine_in_process=false."""
    from serving import launcher

    code = tmp_path / "code"
    code.mkdir()
    (code / "model.py").write_text("")
    env = {"PATH": "/usr/bin", "HOME": str(tmp_path), "SERVING_MODEL_DIR": str(tmp_path / "none"),
           "SAGEMAKER_MODEL_PATH": str(code)}

    def blocker(env):
        p = launcher.plan(env)
        p.env["PYTHONPATH"] = launcher.engine_python_path([str(code)], {})  # as main() sets it after custom_code
        return launcher.in_process_blocker(p)

    assert blocker(env) is None
    (code / "json.py").write_text("")
    assert f"{code} on the engine's path provides json, which this process imported from " in (blocker(env) or "")
    (code / "json.py").unlink()
    assert blocker(env | {"SERVING_ENGINE_IN_PROCESS": "false"}) == "engine_in_process=false"
