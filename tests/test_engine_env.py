"""Environment the launcher hands the engine for GPU start-up behaviour."""
from __future__ import annotations

from serving import launcher


def _engine_env(extra: dict[str, str]) -> dict[str, str]:
    return launcher.plan({"PATH": "/usr/bin", "HOME": "/tmp", **extra}).env


def test_flashinfer_sampler_is_off_unless_asked_for():
    # On a fresh GPU host FlashInfer compiles its sampler with nvcc at the first start (minutes, or a failed
    # start without nvcc); the image runs vLLM's own sampler unless the user turns FlashInfer's back on.
    assert _engine_env({})["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert _engine_env({"VLLM_USE_FLASHINFER_SAMPLER": "1"})["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert _engine_env({"OPTION_FLASHINFER_SAMPLER": "true"})["VLLM_USE_FLASHINFER_SAMPLER"] == "1"


def test_aot_compile_is_vllms_unless_turned_off():
    # vLLM's AOT compile stays as vLLM sets it (on, with the image's torch) unless the setting or the user's own
    # VLLM_USE_AOT_COMPILE turns it off; the setting wins over vLLM's variable.
    assert _engine_env({}).get("VLLM_USE_AOT_COMPILE", "1") == "1"  # set only to keep it on without the cache
    assert _engine_env({"VLLM_USE_AOT_COMPILE": "0"})["VLLM_USE_AOT_COMPILE"] == "0"
    assert _engine_env({"OPTION_AOT_COMPILE": "false"})["VLLM_USE_AOT_COMPILE"] == "0"
    assert _engine_env({"OPTION_AOT_COMPILE": "true", "VLLM_USE_AOT_COMPILE": "0"})["VLLM_USE_AOT_COMPILE"] == "1"


CONTAINER = "610 580 0:61 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
VOLUME = CONTAINER + "641 610 259:1 /cache /opt/lmi/cache rw,relatime - xfs /dev/nvme1n1 rw\n"
TMPFS = CONTAINER + "642 610 0:55 / /opt/lmi/cache rw,relatime - tmpfs tmpfs rw\n"
HOST = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"  # no container: the host's own disk


def _mountinfo(monkeypatch, tmp_path, text: str) -> None:
    from serving import compile_cache
    (tmp_path / "mountinfo").write_text(text)
    monkeypatch.setattr(compile_cache, "MOUNTINFO", tmp_path / "mountinfo")


def test_the_compile_cache_is_off_where_no_later_start_reads_it(monkeypatch, tmp_path):
    # The cache root on the container's overlay root or a tmpfs: the launcher turns vLLM's compile cache off and
    # keeps the AOT compile on (vLLM alone would turn it off without the cache), and says why.
    root = {"VLLM_CACHE_ROOT": "/opt/lmi/cache/vllm"}
    for text, where in ((CONTAINER, "overlay at /"), (TMPFS, "tmpfs at /opt/lmi/cache")):
        _mountinfo(monkeypatch, tmp_path, text)
        p = launcher.plan({"PATH": "/usr/bin", "HOME": "/tmp", **root})
        assert (p.env["VLLM_DISABLE_COMPILE_CACHE"], p.env["VLLM_USE_AOT_COMPILE"]) == ("1", "1")
        assert (f"setting disable_compile_cache=True  [default (VLLM_CACHE_ROOT /opt/lmi/cache/vllm is on the {where}, "
                "which no later start reads); launcher]") in launcher.report(p)


def test_the_compile_cache_stays_where_a_later_start_can_read_it(monkeypatch, tmp_path):
    # On a volume, on a host's own disk outside a container, or with a compilation_config naming its own
    # cache_dir, vLLM's default stays: no variable is handed to the engine.
    _mountinfo(monkeypatch, tmp_path, VOLUME)
    assert {"VLLM_DISABLE_COMPILE_CACHE", "VLLM_USE_AOT_COMPILE"}.isdisjoint(
        _engine_env({"VLLM_CACHE_ROOT": "/opt/lmi/cache/vllm"}))
    assert "VLLM_DISABLE_COMPILE_CACHE" in _engine_env({"VLLM_CACHE_ROOT": "/opt/lmi/other"})
    _mountinfo(monkeypatch, tmp_path, HOST)
    assert "VLLM_DISABLE_COMPILE_CACHE" not in _engine_env({"VLLM_CACHE_ROOT": "/opt/lmi/cache/vllm"})
    _mountinfo(monkeypatch, tmp_path, CONTAINER)
    env = _engine_env({"OPTION_COMPILATION_CONFIG": '{"cache_dir": "/models/compiled"}'})
    assert "VLLM_DISABLE_COMPILE_CACHE" not in env
    # An unreadable mount table changes nothing either.
    monkeypatch.setattr("serving.compile_cache.MOUNTINFO", tmp_path / "missing")
    assert "VLLM_DISABLE_COMPILE_CACHE" not in _engine_env({})


def test_the_users_compile_cache_setting_wins(monkeypatch, tmp_path):
    # The setting or the user's own VLLM_DISABLE_COMPILE_CACHE beats the default; the setting wins over vLLM's
    # variable, and aot_compile or VLLM_USE_AOT_COMPILE over the AOT compile kept without the cache.
    _mountinfo(monkeypatch, tmp_path, CONTAINER)
    on = _engine_env({"OPTION_DISABLE_COMPILE_CACHE": "false", "VLLM_DISABLE_COMPILE_CACHE": "1"})
    assert on["VLLM_DISABLE_COMPILE_CACHE"] == "0" and "VLLM_USE_AOT_COMPILE" not in on
    assert _engine_env({"VLLM_DISABLE_COMPILE_CACHE": "0"})["VLLM_DISABLE_COMPILE_CACHE"] == "0"
    off = _engine_env({"OPTION_DISABLE_COMPILE_CACHE": "true", "OPTION_AOT_COMPILE": "false"})
    assert (off["VLLM_DISABLE_COMPILE_CACHE"], off["VLLM_USE_AOT_COMPILE"]) == ("1", "0")
    _mountinfo(monkeypatch, tmp_path, VOLUME)
    off = _engine_env({"VLLM_DISABLE_COMPILE_CACHE": "1", "VLLM_CACHE_ROOT": "/opt/lmi/cache/vllm"})
    assert (off["VLLM_DISABLE_COMPILE_CACHE"], off["VLLM_USE_AOT_COMPILE"]) == ("1", "1")


def test_a_mount_table_is_read_as_proc_writes_it():
    from pathlib import Path
    from serving import compile_cache

    text = VOLUME + "43 27 0:56 / /mnt/my\\040cache rw - nfs4 srv:/x rw\nnot a mount line\n"
    table = compile_cache.mounts(text)
    assert table == [("/", "overlay"), ("/opt/lmi/cache", "xfs"), ("/mnt/my cache", "nfs4")]
    assert compile_cache.mount_of(Path("/opt/lmi/cache/vllm"), table).point == "/opt/lmi/cache"
    assert compile_cache.mount_of(Path("/opt/lmi/cachex"), table).point == "/"
    assert compile_cache.default(Path("/mnt/my cache/vllm"), {}, text) is None
    assert compile_cache.default(Path("/root/.cache/vllm"), {}, text)[0] == "true"


def test_vllm_forks_its_engine_core_on_the_gpu_build_unless_told_to_spawn(gpu_build):
    # Forked, the engine core (and under tensor parallelism each worker) starts from the process that already
    # imported torch and vLLM; `vllm serve` would spawn fresh interpreters. The user's variable or setting wins;
    # anything but fork or spawn stops the start naming the setting.
    import pytest
    from serving import resolve

    assert _engine_env({})["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert _engine_env({"VLLM_WORKER_MULTIPROC_METHOD": "spawn"})["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert _engine_env({"OPTION_WORKER_MULTIPROC_METHOD": "spawn"})["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    with pytest.raises(resolve.ConfigError, match="worker_multiproc_method") as e:
        _engine_env({"VLLM_WORKER_MULTIPROC_METHOD": "forkserver"})
    assert "fork or spawn" in str(e.value)


def test_the_cpu_build_says_its_engine_processes_are_spawned():
    # vLLM's CPU platform spawns whatever the variable says: the launcher hands it spawn and says why.
    p = launcher.plan({"PATH": "/usr/bin", "HOME": "/tmp"})
    assert p.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert ("setting worker_multiproc_method=spawn  [default (CPU build: vLLM's CPU platform spawns); launcher]"
            in launcher.report(p))
