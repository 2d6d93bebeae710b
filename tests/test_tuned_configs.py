"""The tuned-configs folder the launcher hands vLLM: the image's H200 files read by an H100 80GB HBM3 where neither
configs/ nor vLLM holds one of its own (serving/tuned_configs.py)."""
from __future__ import annotations

import json
import shutil

import pytest

from serving import launcher, resolve, tuned_configs
from serving.paths import CONFIGS_DIR
from serving.vllm_patches.moe_configs import config_file_name

H100 = "NVIDIA_H100_80GB_HBM3"
# The 235B EP8 rank's shape (docs/performance.md)
SHAPE = (16, 1536, [128, 128])


def _plan(monkeypatch, tmp_path, device: str | None, **env: str) -> launcher.Plan:
    monkeypatch.setattr(tuned_configs, "gpu_name", lambda: device)
    return launcher.plan({"PATH": "/usr/bin", "HOME": "/tmp", "LMI_CACHE_DIR": str(tmp_path), **env})


def test_an_h100_reads_the_h200_files_vllm_has_none_of(gpu_build, monkeypatch, tmp_path):
    # On an H100 80GB HBM3 the engine reads a folder under the cache directory: every file of configs/ and each
    # H200 fused-MoE and small-M file again under the H100's name where configs/ holds none of the H100's own (its
    # 235B small-M files, run 42) and vLLM has no FP8 file of its own for the shape, each the same entries as the
    # H200's; the start log says so.
    p = _plan(monkeypatch, tmp_path, H100)
    folder = tmp_path / tuned_configs.FOLDER / H100
    assert p.env["VLLM_TUNED_CONFIG_FOLDER"] == str(folder)
    own = {f.name for f in CONFIGS_DIR.glob(f"N=*device_name={H100},*small_m.json")}
    assert len(own) == 2
    moe = [f.name.replace("NVIDIA_H200", H100) for f in CONFIGS_DIR.glob("E=*device_name=NVIDIA_H200,*.json")]
    small_m = [name for f in CONFIGS_DIR.glob("N=*device_name=NVIDIA_H200,*small_m.json")
               if (name := f.name.replace("NVIDIA_H200", H100)) not in own]
    assert moe and small_m
    assert sorted(p.configs_layout.borrowed) == sorted(moe + small_m)
    assert any(line.startswith(f"tuned configs: the {H100} reads {len(moe)} fused-MoE and {len(small_m)} small-M "
                               "file(s) of the NVIDIA_H200") for line in launcher.report(p))
    tuned_configs.make(p.configs_layout)
    assert sorted(f.name for f in folder.iterdir()) == sorted(
        [f.name for f in CONFIGS_DIR.iterdir() if f.is_file()] + list(p.configs_layout.borrowed))
    ours = folder / config_file_name(*SHAPE, device_name=H100)
    assert json.loads(ours.read_text()) == json.loads((CONFIGS_DIR / config_file_name(*SHAPE)).read_text())
    # the small-M files as run 35b served them on an H100 (bench/data/h100_block_34/small_m_h100, laid over configs/):
    # borrowed as they were, or the H100's own file with the same entries up to 32 tokens
    served = CONFIGS_DIR.parent / "bench" / "data" / "h100_block_34" / "small_m_h100"
    assert sorted(f.name for f in served.iterdir()) == sorted(small_m + list(own))
    for f in served.iterdir():
        if f.name in own:
            before, now = json.loads(f.read_text()), json.loads((folder / f.name).read_text())
            assert before == {m: now[m] for m in before}, f.name
        else:
            assert (folder / f.name).read_bytes() == f.read_bytes()


def test_a_gpu_keeps_a_file_of_its_own(tmp_path):
    # A file named for the GPU, in the configs folder or in vLLM's own, comes first: that shape borrows nothing.
    configs, vllm_dir = tmp_path / "configs", tmp_path / "vllm"
    shutil.copytree(CONFIGS_DIR, configs)
    vllm_dir.mkdir()
    own = config_file_name(*SHAPE, device_name=H100)
    (vllm_dir / own).write_text("{}")
    lay = tuned_configs.layout(configs, tmp_path / "cache", H100, None, vllm_dir)
    assert own not in lay.borrowed and lay.borrowed
    for f in configs.glob("*NVIDIA_H200*"):
        shutil.copy(f, configs / f.name.replace("NVIDIA_H200", H100))
    assert tuned_configs.layout(configs, tmp_path / "cache", H100, None, vllm_dir) == tuned_configs.Layout(configs)


def test_other_gpus_and_configs_device_none_read_their_own_files(gpu_build, monkeypatch, tmp_path):
    # The H200 reads configs/ as it is; so does a GPU with no twin, and the H100 told configs_device=none.
    for device, env in (("NVIDIA_H200", {}), ("NVIDIA_A100-SXM4-80GB", {}), (H100, {"OPTION_CONFIGS_DEVICE": "none"}),
                        (None, {})):
        p = _plan(monkeypatch, tmp_path, device, **env)
        assert (p.env["VLLM_TUNED_CONFIG_FOLDER"], p.configs_layout.links) == (str(CONFIGS_DIR), {})
    # configs_device names the GPU to read for any other: an H100 NVL told the H200's
    p = _plan(monkeypatch, tmp_path, "NVIDIA_H100_NVL", OPTION_CONFIGS_DEVICE="NVIDIA H200")
    assert p.env["VLLM_TUNED_CONFIG_FOLDER"] == str(tmp_path / tuned_configs.FOLDER / "NVIDIA_H100_NVL")
    assert any("(option.configs_device)" in line for line in launcher.report(p))


def test_the_cpu_build_hands_vllm_the_configs_folder(tmp_path):
    p = launcher.plan({"PATH": "/usr/bin", "HOME": "/tmp", "LMI_CACHE_DIR": str(tmp_path)})
    assert p.env["VLLM_TUNED_CONFIG_FOLDER"] == str(CONFIGS_DIR)
    assert not any(line.startswith("tuned configs:") for line in launcher.report(p))


def test_a_configs_device_without_files_stops_the_start(monkeypatch, tmp_path):
    with pytest.raises(resolve.ConfigError) as e:
        _plan(monkeypatch, tmp_path, H100, OPTION_CONFIGS_DEVICE="NVIDIA_A100")
    assert str(e.value).startswith("configs_device from env OPTION_CONFIGS_DEVICE: ")
    assert ("holds no tuned file of the NVIDIA_A100 (its files are the NVIDIA_H100_80GB_HBM3, NVIDIA_H200's)"
            in str(e.value))
    with pytest.raises(resolve.ConfigError, match="is not a GPU's name as config file names spell it"):
        _plan(monkeypatch, tmp_path, H100, OPTION_CONFIGS_DEVICE="../H200")


def test_a_later_start_lays_the_folder_out_again(tmp_path):
    # An earlier start's links go (a file removed from configs/ is not read again); a folder that cannot be made
    # raises OSError, on which the launcher hands vLLM the configs folder itself.
    lay = tuned_configs.layout(CONFIGS_DIR, tmp_path, H100, None, None)
    (lay.folder).mkdir(parents=True)
    (lay.folder / "E=1,N=1,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json").symlink_to(tmp_path / "gone")
    tuned_configs.make(lay)
    assert sorted(f.name for f in lay.folder.iterdir()) == sorted(lay.links)
    assert all((lay.folder / name).resolve() == target.resolve() for name, target in lay.links.items())
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        tuned_configs.make(tuned_configs.Layout(tmp_path / "file" / H100, lay.links, lay.borrowed))


def test_every_twin_the_table_names_has_files_in_configs():
    assert set(tuned_configs.READS_FILES_OF.values()) <= set(tuned_configs.devices_in(CONFIGS_DIR))
    assert tuned_configs.vllm_configs_dir().is_dir()  # vLLM's own files, found without importing vLLM
