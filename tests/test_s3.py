"""S3 model download against a real S3-compatible server on loopback (moto's server mode), real boto3."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from serving.s3 import S3SourceError, download

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def s3_env(moto_env):
    return moto_env


@pytest.fixture(scope="module")
def bucket(s3_env, tmp_path_factory):
    """A bucket holding a model folder (a real tiny model, nested files included), an archive and nothing else."""
    import boto3
    from serving.tiny_model import TinySpec, make

    model = make(tmp_path_factory.mktemp("src") / "tiny", TinySpec(layers=1))
    (model / "extra").mkdir()
    (model / "extra" / "notes.txt").write_text("nested file\n")
    # A LoRA adapter in LMI's layout (its config is all the launcher reads before the engine starts).
    (model / "adapters" / "ad").mkdir(parents=True)
    (model / "adapters" / "ad" / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj"]}')
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="models")
    files = sorted(p for p in model.rglob("*") if p.is_file())
    for p in files:
        s3.upload_file(str(p), "models", "tiny/" + p.relative_to(model).as_posix())
    s3.put_object(Bucket="models", Key="tiny/", Body=b"")  # a console-made folder marker
    arc = tmp_path_factory.mktemp("arc") / "model.tar.gz"
    with tarfile.open(arc, "w:gz") as t:
        t.add(model / "config.json", arcname="config.json")
    s3.upload_file(str(arc), "models", "packed/model.tar.gz")
    return {"src": model, "files": [p.relative_to(model) for p in files]}


def test_download_mirrors_the_prefix(bucket, tmp_path):
    dest = download("s3://models/tiny", tmp_path / "dl")
    got = sorted(p.relative_to(dest) for p in dest.rglob("*") if p.is_file())
    assert got == bucket["files"]
    for rel in got:
        assert (dest / rel).read_bytes() == (bucket["src"] / rel).read_bytes()


def test_second_download_skips_files_of_the_same_size(bucket, tmp_path, caplog):
    dest = tmp_path / "dl"
    download("s3://models/tiny/", dest)
    weights = dest / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    (dest / "config.json").write_text("{}")  # a changed size is fetched again
    caplog.set_level("INFO", logger="serving.s3")
    download("s3://models/tiny/", dest)
    assert weights.stat().st_mtime_ns == stamp
    assert (dest / "config.json").read_bytes() == (bucket["src"] / "config.json").read_bytes()
    assert f"1 files fetched, {len(bucket['files']) - 1} skipped" in caplog.text


def test_empty_prefix_is_a_clear_error(bucket, tmp_path):
    with pytest.raises(S3SourceError, match=r"s3://models/nothing-here/ holds no objects"):
        download("s3://models/nothing-here/", tmp_path / "dl")


@pytest.mark.parametrize("url", ["s3://models/packed/", "s3://models/packed/model.tar.gz"])
def test_single_archive_is_a_clear_error(bucket, tmp_path, url):
    with pytest.raises(S3SourceError, match="archive"):
        download(url, tmp_path / "dl")


def test_launcher_fetches_an_s3_model_before_start(bucket, s3_env, tmp_path, launcher_main):
    """`python -m serving --prepare-only` with model_id=s3://...: the launcher downloads, secrets stay out of logs."""
    rc, out, err = launcher_main({**s3_env, "SERVING_MODEL_DIR": str(tmp_path / "none"),
                                  "OPTION_MODEL_ID": "s3://models/tiny/", "SERVING_DOWNLOAD_DIR": str(tmp_path / "dl")},
                                 ["--prepare-only"])
    assert rc == 0, err[-3000:]
    assert (tmp_path / "dl" / "model.safetensors").stat().st_size == (bucket["src"] / "model.safetensors").stat().st_size
    assert "download of s3://models/tiny/ complete" in err
    assert "LoRA adapters: ad (chosen per request" in err  # found in the download, served by the engine
    assert "SECRET" not in out + err


def test_launcher_exits_non_zero_on_an_empty_prefix(bucket, s3_env, tmp_path, launcher_main):
    # the download comes before the engine, so --prepare-only takes the start's path up to it
    rc, _, err = launcher_main({**s3_env, "SERVING_MODEL_DIR": str(tmp_path / "none"),
                                "HF_MODEL_ID": "s3://models/missing/", "SERVING_DOWNLOAD_DIR": str(tmp_path / "dl")},
                               ["--prepare-only"])
    assert rc == 3
    assert "s3://models/missing/ holds no objects" in err


def test_interrupted_download_restarts_cleanly_and_never_leaves_a_half_file(bucket, s3_env, tmp_path,
                                                                              launcher_main):
    """SIGKILL the launcher halfway through fetching a large weights file, then start again: no
    final file name ever holds a partial file, the next start removes the half-written temporary
    file, fetches what is missing and ends with the exact model."""
    import hashlib
    import signal
    import time

    import boto3

    big = os.urandom(1 << 20) * 192  # 192 MiB: takes a while even on loopback
    s3 = boto3.client("s3")
    for rel in bucket["files"]:
        s3.upload_file(str(bucket["src"] / rel), "models", "big/" + rel.as_posix())
    s3.put_object(Bucket="models", Key="big/model-00002.safetensors", Body=big)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_VLLM_", "HF_"))}
    env.update(s3_env)
    dest = tmp_path / "dl"
    env.update({"SERVING_MODEL_DIR": str(tmp_path / "none"), "OPTION_MODEL_ID": "s3://models/big/",
                "SERVING_DOWNLOAD_DIR": str(dest)})
    cmd = [sys.executable, "-m", "serving", "--prepare-only"]

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    partial = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        partial = [p for p in dest.glob("model-00002.safetensors.*") if 0 < p.stat().st_size < len(big)] \
            if dest.is_dir() else []
        if partial:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert partial, "the download finished before it could be interrupted"
    final = dest / "model-00002.safetensors"
    assert not final.exists() or final.stat().st_size == len(big), "a final file name holds a partial file"

    rc, _, err = launcher_main({k: env[k] for k in (*s3_env, "SERVING_MODEL_DIR", "OPTION_MODEL_ID",
                                                  "SERVING_DOWNLOAD_DIR")}, ["--prepare-only"])  # the next start
    assert rc == 0, err[-3000:]
    assert "left half-written by an interrupted download" in err
    assert hashlib.sha256(final.read_bytes()).digest() == hashlib.sha256(big).digest()
    for rel in bucket["files"]:
        assert (dest / rel).read_bytes() == (bucket["src"] / rel).read_bytes()
    assert sorted(p.name for p in dest.iterdir() if p.is_file()) == \
        sorted({rel.parts[0] for rel in bucket["files"] if len(rel.parts) == 1} | {final.name})


def test_user_code_downloaded_from_s3_is_prepared(bucket, s3_env, tmp_path):
    """requirements.txt (with its wheel folder) and model.py that come with an s3:// model are installed and
    checked from the download, as from /opt/ml/model."""
    import boto3
    from user_code import WHEEL_NAME, WHEEL_VERSION, make_wheel

    s3 = boto3.client("s3")
    extra = {"requirements.txt": f"{WHEEL_NAME}=={WHEEL_VERSION}\n".encode(),
             "model.py": (b"import lmi_fixture_greeting\nfrom djl_python.output_formatter import output_formatter\n\n"
                          b"@output_formatter\ndef tagged(response):\n    return lmi_fixture_greeting.TAG\n")}
    wheel = make_wheel(tmp_path / "wheels")
    extra[f"requirements/{wheel.name}"] = wheel.read_bytes()
    for rel in bucket["files"]:
        s3.upload_file(str(bucket["src"] / rel), "models", "coded/" + rel.as_posix())
    for rel, data in extra.items():
        s3.put_object(Bucket="models", Key="coded/" + rel, Body=data)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_VLLM_", "HF_"))}
    env.update(s3_env)
    env.update({"SERVING_MODEL_DIR": str(tmp_path / "none"), "OPTION_MODEL_ID": "s3://models/coded/",
                "SERVING_DOWNLOAD_DIR": str(tmp_path / "dl"), "LMI_CACHE_DIR": str(tmp_path / "cache"),
                "PIP_NO_INDEX": "1"})
    r = subprocess.run([sys.executable, "-m", "serving", "--prepare-only"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"requirements.txt: installed {WHEEL_NAME} {WHEEL_VERSION}" in r.stderr
    assert f"custom code: {tmp_path / 'dl' / 'model.py'}: LMI output formatter tagged" in r.stderr
