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
