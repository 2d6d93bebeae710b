"""The image test (`make image-test`): build the CPU flavour of ./Dockerfile with buildah, run a
container from it serving the embedded tiny model, smoke-check it, remove what it made.

No Docker engine is needed: tools/image_build.py installs buildah and debootstrap when they are
missing (apt-get, as root), makes a Debian bookworm base image once (kept, as
localhost/lmi-base:bookworm) and builds with `--storage-driver vfs --isolation chroot`. The
container runs the image's own ENTRYPOINT and CMD (tini -> entrypoint.sh serve -> launcher ->
vLLM) as the image's non-root user, on the host network, on a free loopback port.

Time on the project's 2-core machine (2026-11-29, base image cached): about 8-10 minutes, of which
the build takes about 4, `buildah from` (a vfs copy of the 4.3 GB image) about 1 and the engine's
start about 2; a fresh machine adds about 1 minute for apt-get and 1.5 for the base. Each run
prints an "[image] timings" line and writes it to ~/.cache/lmi-image-test/last-timings.json.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tools import image_build as ib
from tools.launcher_process import Server, free_port, require_ready

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.image, pytest.mark.timeout(3600)]

TIMES: dict[str, float] = {}
T0 = time.monotonic()


def _report(config, msg: str) -> None:
    """Past pytest's capture (the timings are the point), and into the cache folder."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is not None and capman is not None:
        with capman.global_and_fixture_disabled():
            tr.write_line(f"\n[image] {msg}")
    ib.CACHE.mkdir(parents=True, exist_ok=True)
    (ib.CACHE / "last-timings.json").write_text(json.dumps({k: round(v) for k, v in TIMES.items()}, indent=1))


@pytest.fixture(scope="module")
def image(tmp_path_factory, request):
    logs = tmp_path_factory.mktemp("image")
    t = time.monotonic()
    ib.ensure_tools()
    ib.ensure_base()
    TIMES["tools+base"] = time.monotonic() - t
    t = time.monotonic()
    ib.remove_image(ib.TEST_IMAGE)
    ib.build(ib.TEST_IMAGE, log_path=logs / "build.log")
    TIMES["build"] = time.monotonic() - t
    yield ib.TEST_IMAGE
    t = time.monotonic()
    ib.clean()
    TIMES["cleanup"] = time.monotonic() - t
    TIMES["total"] = time.monotonic() - T0
    _report(request.config, "timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items()))


@pytest.fixture(scope="module")
def container(image, tmp_path_factory):
    logs = tmp_path_factory.mktemp("run")
    port = free_port()
    t = time.monotonic()
    t0 = time.time() - 1  # files older than this come from the image itself
    c = ib.start(image, {"OPTION_HOST": "127.0.0.1", "OPTION_PORT": str(port),
                         "VLLM_CPU_OMP_THREADS_BIND": "auto"}, logs / "container.log")
    c.url = f"http://127.0.0.1:{port}"
    c.t0 = t0
    c.started = time.time()
    try:
        require_ready(Server(c.url, c.proc, c.log_path, started=time.monotonic()), timeout=600)
    except BaseException:
        c.stop()
        c.remove()
        raise
    TIMES["container start->ready"] = time.monotonic() - t
    yield c
    c.stop()
    c.remove()


@pytest.fixture(scope="module")
def http(container):
    import httpx

    with httpx.Client(base_url=container.url, timeout=120) as h:
        yield h


# --- the image's metadata ------------------------------------------------------------------------

def test_image_metadata(image):
    cfg = ib.image_config(image)
    assert cfg["User"].split(":")[0] not in ("", "0", "root")
    assert "8080/tcp" in cfg["ExposedPorts"]
    assert cfg["Entrypoint"][-1] == "entrypoint.sh" and os.path.basename(cfg["Entrypoint"][0]) == "tini"
    assert cfg["Cmd"] == ["serve"]
    hc = cfg.get("Healthcheck") or {}
    # python -m serving --healthcheck probes /ping on the port the settings resolve (test_healthcheck_command_passes)
    assert hc.get("Test", [""])[0] == "CMD" and hc["Test"][-1] == "--healthcheck"
    labels = cfg["Labels"]
    assert labels["lmi-fp8-moe.vllm.version"] == ib.series_vllm_version()
    assert labels["lmi-fp8-moe.vllm.patches"] == ib.series_patches()
    assert labels["lmi-fp8-moe.vllm.requirements"] == "requirements/cpu.txt"
    envs = dict(e.split("=", 1) for e in cfg["Env"])
    assert envs["VLLM_TUNED_CONFIG_FOLDER"] == "/opt/lmi/configs"


# --- the running container ------------------------------------------------------------------------

def test_ping(http):
    assert http.get("/ping").status_code == 200


def test_lmi_body(http):
    r = http.post("/invocations", json={"inputs": "hi", "parameters": {"max_new_tokens": 8}})
    assert r.status_code == 200, r.text
    assert isinstance(r.json()["generated_text"], str)


def test_openai_completion_body(http):
    r = http.post("/invocations", json={"prompt": "hi", "max_tokens": 8})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "text_completion" and isinstance(doc["choices"][0]["text"], str)


def test_lmi_stream_is_jsonlines(http):
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 8, "ignore_eos_token": True}, "stream": True}
    with http.stream("POST", "/invocations", json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("application/jsonlines")
        records = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert len(records) == 8, records
    for rec in records:
        assert set(rec["token"]) >= {"id", "text", "logprob"}
    assert all(rec["generated_text"] is None for rec in records[:-1])
    assert records[-1]["generated_text"] == "".join(rec["token"]["text"] for rec in records)


def test_in_container_facts(container):
    """Non-root, the baked tiny model is served as is, the patch record is in the image."""
    uid = container.exec(["id", "-u"])
    assert uid.returncode == 0 and uid.stdout.strip() not in ("", "0"), uid
    dry = container.exec(["python", "-m", "serving", "--dry-run"], timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "model: /opt/lmi/cache/tiny-qwen3-moe (embedded)" in dry.stdout
    assert f"vLLM patches applied to {ib.series_vllm_version()}" in dry.stdout
    assert "env VLLM_TUNED_CONFIG_FOLDER=/opt/lmi/configs" in dry.stdout
    # vLLM's model-info files, built with the image, were laid into its cache folder at the start
    log = container.log_path.read_text()
    assert re.search(r"vLLM's model-info cache: [1-9]\d* file\(s\) from /opt/venv/lmi-modelinfos", log), log[-3000:]
    infos = container.exec(["ls", "/opt/lmi/cache/vllm/modelinfos"])
    assert "vllm-model_executor-models-qwen3_moe-Qwen3MoeForCausalLM.json" in infos.stdout.split(), infos
    # The model made at build time was served as is, not remade at start.
    st = container.exec(["stat", "-c", "%Y", "/opt/lmi/cache/tiny-qwen3-moe/model.safetensors"])
    assert st.returncode == 0 and int(st.stdout) < container.started, "the baked tiny model was remade"


# Where the running container may write: its cache (HF, vLLM, Triton, S3 downloads), /tmp, the model
# folder; and what the runtime itself provides (buildah run writes these, as Docker does).
WRITABLE = ("/opt/lmi/cache/", "/tmp/", "/opt/ml/model/")
RUNTIME_FILES = ("/etc/hosts", "/etc/resolv.conf", "/etc/hostname", "/run/")


def test_writes_only_to_cache_tmp_and_model(container, http):
    """After start and served requests, no file outside the writable folders was created or changed,
    so the image runs with a read-only root filesystem and writable cache and model volumes."""
    assert http.post("/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 4}}).status_code == 200
    root = ib.out(ib.BUILDAH + ["mount", container.name]).strip()
    try:
        found = subprocess.run(["find", root, "-xdev", "-newermt", f"@{container.t0:.0f}", "-not", "-type", "d"],
                               capture_output=True, text=True, timeout=300).stdout.split("\n")
    finally:
        subprocess.run(ib.BUILDAH + ["umount", container.name], capture_output=True)
    written = [p[len(root):] for p in found if p.startswith(root)]
    outside = [p for p in written if not p.startswith(WRITABLE) and not p.startswith(RUNTIME_FILES)]
    assert any(p.startswith("/opt/lmi/cache/") for p in written), "no write seen at all: the check is blind"
    assert not outside, outside[:30]


def test_healthcheck_command_passes(image, container):
    test = ib.image_config(image)["Healthcheck"]["Test"]
    r = container.exec(test[1:], timeout=30)
    assert r.returncode == 0, r.stderr


def test_sigterm_reaches_the_engine(container):
    """Last: SIGTERM to tini (the image's PID 1) stops vLLM and every process it started."""
    assert ib._first_with_cmd(container.descendants(), "tini"), "tini is not the container's first process"
    t = time.monotonic()
    rc = container.stop(timeout=90)  # SIGTERM to tini only
    took = time.monotonic() - t
    assert took < 90, "the engine did not stop on SIGTERM; it was killed"
    assert container.descendants() == []
    TIMES["sigterm->exit"] = took
    assert rc is not None
    # tini forwarded the signal to vLLM's API server, which shut its engine down itself.
    assert "API server: shutdown triggered" in container.log()
