"""The GPU runtime's lock and wheelhouse selection (tools/gpu_wheelhouse.py), checked without a network."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools import gpu_wheelhouse as gw

ROOT = Path(__file__).resolve().parent.parent
REQ = ROOT / "requirements"


def test_lock_holds_every_top_level_pin_and_the_override():
    lock = gw.read_pins(REQ / "gpu.lock")
    for top in ("gpu.txt", "serving.txt"):
        for name, version in gw.read_pins(REQ / top).items():
            assert lock.get(name) == version, f"{top}: {name}=={version}, lock has {lock.get(name)}"
    for name, version in gw.read_pins(REQ / "gpu-overrides.txt").items():
        assert lock[name] == version, f"override {name}=={version} not applied"
    # vLLM 0.32's kernel warm-up imports torchvision: the GPU runtime must carry the build for its torch
    assert lock["torchvision"] == "0.28.0" and lock["torch"] == "2.13.0"


def test_smoke_lock_holds_the_smoke_tools():
    smoke = gw.read_pins(REQ / "smoke.lock")
    for name, version in gw.read_pins(REQ / "smoke.txt").items():
        assert smoke[name] == version


def test_host_freeze_leaves_out_exact_versions_only(tmp_path):
    lock = gw.read_pins(REQ / "gpu.lock")
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(f"numpy=={lock['numpy']}\ntorch==2.11.0\nsome-other==1.0\nNvidia_CuBLAS=={lock['nvidia-cublas']}\n")
    wanted, left = gw.selection(freeze, [])
    assert set(left) == {"numpy", "nvidia-cublas"}  # names compare canonically; torch 2.11 does not satisfy 2.13
    assert "torch" in wanted and "numpy" not in wanted and "some-other" not in wanted


def test_skip_names_must_be_in_the_locks():
    wanted, left = gw.selection(None, ["nvidia_nvtx"])
    assert "nvidia-nvtx" in left and "nvidia-nvtx" not in wanted
    with pytest.raises(SystemExit, match="not-a-package"):
        gw.selection(None, ["not-a-package"])


def test_make_gpu_wheelhouse_needs_a_folder():
    r = subprocess.run(["make", "-s", "gpu-wheelhouse"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "set WHEELHOUSE=<folder>" in r.stderr


# --- The peer arms' runtimes (bench/e2e's sglang, vllm-latest and sglang-latest) ---

# The exact pins of sglang 0.5.21's, vllm 0.34.0's and sglang 0.5.23's wheels (their METADATA's Requires-Dist on
# Linux x86_64, no extra), read from the wheels themselves: each lock holds them, but where its overrides file says
# otherwise.
SGLANG_0_5_21_PINS = {
    "apache-tvm-ffi": "0.1.11", "blobfile": "3.0.0", "compressed-tensors": "0.18.0", "cuda-tile": "1.6.0rc5",
    "flashinfer-python": "0.6.18", "humming-kernels": "0.1.12", "numba": "0.65.1", "nvidia-cutlass-dsl": "4.6.2",
    "nvidia-mathdx": "25.6.0", "openai": "2.6.1", "openai-harmony": "0.0.4", "outlines": "0.1.11",
    "quack-kernels": "0.6.4", "sentencepiece": "0.2.1", "sgl-deep-ep": "0.1.2", "sgl-deep-gemm": "0.2.0",
    "sglang-kernel": "0.4.7", "soundfile": "0.13.1", "tilelang": "0.1.12", "timm": "1.0.16", "tokenizers": "0.22.2",
    "tokenspeed-mla": "0.1.8", "torch": "2.13.0", "torchaudio": "2.11.0", "torchcodec": "0.15.0",
    "transformers": "5.12.1", "xgrammar": "0.2.7"}
VLLM_0_34_0_PINS = {
    "lm-format-enforcer": "0.11.3", "outlines-core": "0.2.14", "lark": "1.2.2", "xgrammar": "0.2.8",
    "compressed-tensors": "0.17.0", "depyf": "0.20.0", "numba": "0.65.0", "torch": "2.14.0", "torchaudio": "2.11.0",
    "torchvision": "0.29.0", "pynvvideocodec": "2.0.4", "flashinfer-python": "0.7.3", "apache-tvm-ffi": "0.1.11",
    "tilelang": "0.1.12", "nvtx": "0.2.15", "nvidia-cutlass-dsl": "4.8.0", "quack-kernels": "0.6.5",
    "tokenspeed-mla": "2.0.3", "humming-kernels": "0.1.19"}
SGLANG_0_5_23_PINS = {
    "apache-tvm-ffi": "0.1.11", "blobfile": "3.0.0", "compressed-tensors": "0.18.0", "deepseek-recipe": "0.2.0",
    "flashinfer-python": "0.7.2", "humming-kernels": "0.1.12", "numba": "0.65.1", "nvidia-cutlass-dsl": "4.8.0",
    "nvidia-mathdx": "25.6.0", "openai": "2.8.0", "openai-harmony": "0.0.4", "outlines": "0.1.11",
    "quack-kernels": "0.6.5", "sentencepiece": "0.2.1", "sgl-deep-ep": "0.1.2.post1", "sgl-deep-gemm": "0.2.3.post2",
    "sgl-flash-mla": "1.0.0", "sglang-kernel": "0.4.10", "soundfile": "0.13.1", "tilelang": "0.1.12",
    "timm": "1.0.25", "tml-renderers": "0.1.0", "tokenizers": "0.23.2", "torch": "2.14.1", "torchaudio": "2.11.0",
    "torchcodec": "0.17.0", "transformers": "5.19.0", "xgrammar": "0.2.7"}
# What each runtime's overrides change of those pins (None: left out), and why is in the overrides file
CHANGED = {"sglang": {"torchaudio": None, "torchcodec": None, "cuda-tile": "1.6.0"},
           "vllm-latest": {"torchaudio": None, "flashinfer-python": "0.7.4"},
           "sglang-latest": {"torchaudio": None}}


@pytest.mark.parametrize("runtime,pins", [("sglang", SGLANG_0_5_21_PINS), ("vllm-latest", VLLM_0_34_0_PINS),
                                          ("sglang-latest", SGLANG_0_5_23_PINS)])
def test_each_peer_lock_holds_its_engines_own_pins_but_the_overrides(runtime, pins):
    lock = gw.locked(runtime)
    for name, version in pins.items():
        want = CHANGED[runtime].get(name, version)
        assert lock.get(name) == want, f"{runtime}: {name} locked {lock.get(name)}, {want} wanted"
    for name, version in gw.read_pins(REQ / f"{runtime}.txt").items():
        assert lock[name] == version
    for name, version in gw.read_pins(REQ / f"{runtime}-overrides.txt").items():
        assert lock[name] == version, f"override {name}=={version} not applied"


def test_the_peer_locks_leave_out_torchaudio_and_pin_their_torch():
    image, sglang, latest = gw.locked("image"), gw.locked("sglang"), gw.locked("vllm-latest")
    assert "torchaudio" not in sglang and "torchaudio" not in latest and "torchcodec" not in sglang
    # SGLang runs on the image's torch 2.13 and its CUDA libraries; vLLM 0.34 on torch 2.14 and its own Triton
    assert sglang["torch"] == image["torch"] == "2.13.0" and sglang["triton"] == image["triton"]
    assert sglang["sglang"] == "0.5.21" and "vllm" not in sglang
    assert (latest["torch"], latest["vllm"], latest["torchvision"]) == ("2.14.0", "0.34.0", "0.29.0")
    assert latest["triton"] != image["triton"]
    assert sglang["nvidia-nccl-cu13"] == latest["nvidia-nccl-cu13"] == image["nvidia-nccl-cu13"]
    # SGLang 0.5.23 on torch 2.14.1 and its own Triton, the image's NCCL; torchcodec 0.17.0 loads beside torch 2.14
    newest = gw.locked("sglang-latest")
    assert (newest["sglang"], newest["torch"], newest["triton"]) == ("0.5.23", "2.14.1", "3.8.0")
    assert "torchaudio" not in newest and "vllm" not in newest and newest["torchcodec"] == image["torchcodec"]
    assert newest["nvidia-nccl-cu13"] == image["nvidia-nccl-cu13"]


def test_a_peer_wheelhouse_holds_only_what_the_image_runtime_lacks_at_that_version():
    wanted, left = gw.selection(None, ["nvidia-cutlass-dsl-libs-cu12"], "sglang")
    image = gw.locked("image")
    assert "torch" in left and "torch" not in wanted  # the image's torch 2.13
    assert wanted["sglang"] == "0.5.21" and wanted["transformers"] == "5.12.1" and "torchaudio" not in wanted
    assert all(image.get(n) != v for n, v in wanted.items())
    assert all(image.get(n) == v for n, v in left.items() if n != "nvidia-cutlass-dsl-libs-cu12")
    wanted, left = gw.selection(None, ["nvidia-cudnn-cu13", "opencv-python-headless"], "vllm-latest")
    assert {"torch", "triton", "vllm", "torchvision", "flashinfer-python", "transformers"} <= set(wanted)
    assert "nvidia-cudnn-cu13" in left and "torchaudio" not in wanted
    wanted, left = gw.selection(None, [], "sglang-latest")
    assert {"torch", "triton", "sglang", "sglang-kernel", "torchvision", "flashinfer-python"} <= set(wanted)
    assert left["torchcodec"] == image["torchcodec"] and "torchaudio" not in wanted
    with pytest.raises(SystemExit, match="torchaudio"):  # a --skip must name a package of that runtime's lock
        gw.selection(None, ["torchaudio"], "sglang")


def test_packed_parts_carry_the_runtimes_name(tmp_path):
    """pack --name: parts NAME.tar.part-NNN holding the folder NAME, so that several wheelhouses' parts share one
    staging folder (bench/e2e/runbook.sh: the image's wheelhouse.tar.part-* and each peer's)."""
    import tarfile

    src = tmp_path / "w"
    src.mkdir()
    (src / "a.whl").write_bytes(b"x" * 3000)
    (src / "requirements.txt").write_text("a==1\n")
    gw.pack(src, tmp_path / "parts", "1K", name="wheelhouse-sglang")
    parts = sorted((tmp_path / "parts").iterdir())
    assert len(parts) > 3 and all(p.name.startswith("wheelhouse-sglang.tar.part-") for p in parts)
    joined = tmp_path / "joined.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as t:
        assert {"wheelhouse-sglang/a.whl", "wheelhouse-sglang/requirements.txt"} <= set(t.getnames())
