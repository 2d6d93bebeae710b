"""vLLM's model-info files: made when the venv is built, laid into the engine's cache folder by the launcher, and read
by vLLM itself instead of inspecting the model's class in a child process."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from serving import modelinfo_cache

# vLLM's own inspection of each architecture, where its child process (what it runs on a cache miss) is refused
INSPECT = """
import sys
from vllm.model_executor.models import registry

def refused(fn):
    raise SystemExit("vLLM wanted its inspection child process: no usable file in its cache folder")

registry._run_in_subprocess = refused
for arch in sys.argv[1:]:
    info = registry.ModelRegistry.models[arch].inspect_model_cls()
    print(arch, info.is_text_generation_model)
"""


def test_the_venvs_files_are_read_by_vllm_from_its_cache_folder(tmp_path):
    """make venv built a file for every architecture (the install step a fresh clone runs), and vLLM, given a cache
    folder the launcher's seed filled, answers each from there: it never asks for its child process."""
    files = sorted((modelinfo_cache.SHIPPED / modelinfo_cache.FOLDER).glob("*.json"))
    assert len(files) == len(modelinfo_cache.ARCHITECTURES), (modelinfo_cache.SHIPPED, files)
    # readable by every user (the image serves as a non-root user; vLLM's own writer makes them 0600)
    assert all(stat.S_IMODE(f.stat().st_mode) & 0o044 == 0o044 for f in files), files
    assert modelinfo_cache.seed(tmp_path) == ([f.name for f in files], None)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", INSPECT, *modelinfo_cache.ARCHITECTURES], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [w for arch in modelinfo_cache.ARCHITECTURES for w in (arch, "True")]


def test_seed_adds_missing_files_and_keeps_the_cache_folders_own(tmp_path):
    shipped = tmp_path / "shipped"
    (shipped / modelinfo_cache.FOLDER).mkdir(parents=True)
    for name in ("a.json", "b.json"):
        (shipped / modelinfo_cache.FOLDER / name).write_text(f'{{"shipped": "{name}"}}')
    root = tmp_path / "cache"
    (root / modelinfo_cache.FOLDER).mkdir(parents=True)
    (root / modelinfo_cache.FOLDER / "a.json").write_text('{"own": 1}')
    assert modelinfo_cache.seed(root, shipped) == (["b.json"], None)
    assert (root / modelinfo_cache.FOLDER / "a.json").read_text() == '{"own": 1}'
    assert (root / modelinfo_cache.FOLDER / "b.json").read_text() == '{"shipped": "b.json"}'
    assert modelinfo_cache.seed(root, shipped) == ([], None)  # nothing left to add
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    copied, failed = modelinfo_cache.seed(blocked / "cache", shipped)  # cannot be made: said, and no exception
    assert copied == [] and failed.startswith(("NotADirectoryError", "FileExistsError")), failed
    assert modelinfo_cache.seed(root, tmp_path / "nothing-shipped") == ([], None)


def test_the_engines_cache_folder_follows_vllms_rule(tmp_path):
    assert modelinfo_cache.engine_cache_root({"VLLM_CACHE_ROOT": str(tmp_path / "v"), "HOME": "/h"}) == tmp_path / "v"
    assert modelinfo_cache.engine_cache_root({"XDG_CACHE_HOME": str(tmp_path / "x"), "HOME": "/h"}) == \
        tmp_path / "x" / "vllm"
    assert modelinfo_cache.engine_cache_root({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "vllm"
    assert os.environ.get("HOME") != str(tmp_path)  # the launcher's own environment is left as it was
    assert Path.home() != tmp_path
