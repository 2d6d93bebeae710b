"""tools/peer_runtimes.py: the engine bench's peer runtimes (SGLang 0.5.21, vLLM 0.34.0, SGLang 0.5.23) as venvs
beside the image's, checked on the CPU with stand-in packages: what their Python imports, in which order, and what
it never sees (the image's vLLM)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import peer_runtimes as pr

ROOT = Path(__file__).resolve().parent.parent


def _package(site: Path, name: str, version: str, module: str | None = None) -> None:
    """A stand-in installed project: its module (saying its version) and its .dist-info."""
    mod = site / (module or name)
    mod.mkdir(parents=True)
    (mod / "__init__.py").write_text(f"VERSION = {version!r}\n")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _pth_package(site: Path, version: str) -> None:
    """A stand-in of nvidia-cutlass-dsl: its module `cutlass` lies in a folder that its .pth file puts on the path."""
    _package(site / "nvidia_cutlass_dsl" / "python_packages", "nvidia-cutlass-dsl", version, module="cutlass")
    (site / "nvidia_cutlass_dsl_packages.pth").write_text("nvidia_cutlass_dsl/python_packages\n")


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return pr.purelib(path / "bin" / "python")


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory) -> Path:
    """An image venv as make gpu-venv leaves it: torch, transformers and the patched vLLM in its site-packages,
    the host's packages behind it through host-site (_host_site.pth)."""
    venv = tmp_path_factory.mktemp("image") / "venv-gpu"
    site = _venv(venv)
    _package(site, "torch", "2.13.0")
    _package(site, "transformers", "5.19.0")
    _package(site, "vllm", "0.32.0")
    _package(site, "fastapi", "0.136.3")
    _pth_package(site, "4.8.0")
    (venv / "host-site").mkdir()
    _package(venv / "host-site", "nvidia-cublas", "13.1.0.3", module="cublas_stand_in")
    (site / "_host_site.pth").write_text(str(venv / "host-site") + "\n")
    return venv


def _install(tmp_path: Path, image_venv: Path, own: dict[str, str]) -> Path:
    """peer_runtimes.install with pip's step standing in: the wheelhouse's projects `own` written into the
    --target folder it was given (the venv's own site-packages)."""
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    (wh / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in own.items()))
    calls = []

    def run(cmd, check):
        calls.append(cmd)
        if "pip" not in cmd:
            return subprocess.run(cmd, check=check)
        target = Path(cmd[cmd.index("--target") + 1])
        for name, version in own.items():
            _package(target, name, version)

    py = pr.install("sglang", wh, image_venv, tmp_path / "venv-peer", run=run)
    pip = next(c for c in calls if "pip" in c)
    assert pip[0] == str(image_venv / "bin" / "python")  # the image venv's pip, into the peer's site
    assert {"--no-index", "--no-deps", "--target"} <= set(pip) and pip[-2:] == ["-r", str(wh / "requirements.txt")]
    return py


def _imports(py: Path) -> dict:
    code = ("import importlib.util, importlib.metadata as md, json, sys\n"
            "out = {}\n"
            "for m in ('torch', 'transformers', 'fastapi', 'cublas_stand_in', 'sglang'):\n"
            "    spec = importlib.util.find_spec(m)\n"
            "    out[m] = None if spec is None else __import__(m).VERSION\n"
            "out['vllm'] = importlib.util.find_spec('vllm') is not None\n"
            "out['transformers_metadata'] = md.version('transformers')\n"
            "print(json.dumps(out))\n")
    return json.loads(subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True).stdout)


def test_a_peer_runtime_reads_its_own_packages_then_the_images_but_never_its_vllm(tmp_path, image_venv):
    py = _install(tmp_path, image_venv, {"sglang": "0.5.21", "transformers": "5.12.1"})
    seen = _imports(py)
    assert seen == {"torch": "2.13.0",  # the image's, at the version SGLang pins
                    "transformers": "5.12.1", "transformers_metadata": "5.12.1",  # its own, over the image's 5.19
                    "sglang": "0.5.21", "fastapi": "0.136.3", "cublas_stand_in": "13.1.0.3",  # the host's
                    "vllm": False}
    shared = tmp_path / "venv-peer" / "image-site"
    names = {p.name for p in shared.iterdir()}
    assert "vllm" not in names and "vllm-0.32.0.dist-info" not in names
    assert "transformers-5.19.0.dist-info" not in names and "transformers" in names  # one version's metadata
    assert "_host_site.pth" not in names and all(p.is_symlink() for p in shared.iterdir())
    pth = (pr.purelib(py) / pr.PTH).read_text().splitlines()
    assert pth == [f"import site; site.addsitedir({str(shared)!r})", str(image_venv / "host-site")]


def test_the_images_pth_packages_reach_a_runtime_unless_it_holds_its_own(tmp_path, image_venv):
    """A module the image has through a .pth file (nvidia-cutlass-dsl's `cutlass`, which vLLM 0.34 imports while it
    warms up) is importable in a runtime that shares it, and a runtime with the project's own version (SGLang's
    cutlass-dsl 4.6.2) imports its own: its .pth is read before the runtime's, which sorts last."""
    code = "import cutlass; print(cutlass.VERSION)"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shared = _install(tmp_path / "a", image_venv, {"vllm": "0.34.0"})
    assert subprocess.run([str(shared), "-c", code], check=True, capture_output=True, text=True).stdout.split() == [
        "4.8.0"]
    own = _install(tmp_path / "b", image_venv, {"sglang": "0.5.21"})
    _pth_package(pr.purelib(own), "4.6.2")
    assert subprocess.run([str(own), "-c", code], check=True, capture_output=True, text=True).stdout.split() == [
        "4.6.2"]
    assert sorted(p.name for p in pr.purelib(own).glob("*.pth"))[-1] == pr.PTH


def test_a_torch_of_its_own_shadows_the_images(tmp_path, image_venv):
    """vllm-latest: torch 2.14 and vLLM 0.34 in its own site, over the image's torch 2.13 and patched vLLM 0.32."""
    py = _install(tmp_path, image_venv, {"torch": "2.14.0", "vllm": "0.34.0"})
    out = subprocess.run([str(py), "-c", "import torch, vllm, importlib.metadata as md; "
                                         "print(torch.VERSION, vllm.VERSION, md.version('torch'))"],
                         check=True, capture_output=True, text=True).stdout.split()
    assert out == ["2.14.0", "0.34.0", "2.14.0"]


def test_a_missing_wheelhouse_is_named(tmp_path, image_venv):
    with pytest.raises(SystemExit, match="requirements.txt is missing"):
        pr.install("sglang", tmp_path / "none", image_venv, tmp_path / "v")


def test_check_fails_on_an_engine_package_off_its_lock_or_the_images_vllm():
    lock = pr.read_lock("sglang")
    assert lock["sglang"] == "0.5.21" and lock["torch"] == "2.13.0"
    assert pr.compare("sglang", dict(lock), False) == ([], [])
    off = dict(lock, torch="2.11.0", **{"nvidia-cudnn-cu13": "9.19.0.56"})
    failures, notes = pr.compare("sglang", off, True)
    assert failures == ["torch: lock 2.13.0, runtime 2.11.0",
                        "vllm: importable in SGLang's runtime (the image's patched vLLM must stay out of it)"]
    assert notes == ["nvidia-cudnn-cu13: lock 9.20.0.48, runtime 9.19.0.56"]  # the host's CUDA library: a note
    latest = pr.read_lock("vllm-latest")
    assert pr.compare("vllm-latest", dict(latest), True) == ([], [])  # its own vLLM is the point
    failures, _ = pr.compare("vllm-latest", {k: v for k, v in latest.items() if k != "vllm"}, True)
    assert failures == ["vllm: lock 0.34.0, runtime missing"]
    newest = pr.read_lock("sglang-latest")  # checked as sglang is, against its own lock
    assert pr.compare("sglang-latest", dict(newest), False) == ([], [])
    failures, _ = pr.compare("sglang-latest", dict(newest, torch="2.13.0"), True)
    assert failures == ["torch: lock 2.14.1, runtime 2.13.0",
                        "vllm: importable in SGLang's runtime (the image's patched vLLM must stay out of it)"]


def test_check_reads_the_runtimes_python(tmp_path, image_venv):
    py = _install(tmp_path, image_venv, {"sglang": "0.5.21", "transformers": "5.12.1"})
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "peer_runtimes.py"), "check", "sglang", "--python",
                        str(py)], capture_output=True, text=True)
    # the stand-in runtime lacks most of SGLang's lock: listed, and torch 2.13.0 and sglang as locked; of its
    # modules, sglang and cutlass (the image's, through its .pth) are found, the others not
    assert r.returncode == 1 and "sglang: FAILED: sglang-kernel: lock 0.4.7, runtime missing" in r.stdout
    unfound = [line for line in r.stdout.splitlines() if "not found on the runtime's path" in line]
    assert unfound == [f"sglang: FAILED: module {m}: not found on the runtime's path"
                       for m in ("sgl_kernel", "deep_gemm", "flashinfer")]
    assert "sglang 0.5.21" in r.stdout.splitlines()[-1] and "torch 2.13.0" in r.stdout.splitlines()[-1]


def _wheel(dest: Path, name: str, version: str) -> None:
    """A real (tiny) wheel of one module, as pip installs it."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(t.encode())}\n" for p, t in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(dest / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
        z.writestr(f"{info}/RECORD", record)


def test_the_session_scripts_peers_step_installs_a_runtime_from_its_staged_parts(tmp_path, image_venv):
    """bench/e2e/runbook.sh peers: the parts of wheelhouse-sglang staged beside the image's are joined, unpacked,
    installed as the sglang venv (the image venv's pip, a real wheel) and removed; then check runs (failing here:
    the stand-in wheelhouse holds one package of SGLang's lock)."""
    from tools import gpu_wheelhouse as gw

    pip_venv = tmp_path / "venv-gpu"  # an image venv with pip, the stand-in packages linked in
    subprocess.run([sys.executable, "-m", "venv", str(pip_venv)], check=True)
    site = pr.purelib(pip_venv / "bin" / "python")
    for p in pr.purelib(image_venv / "bin" / "python").iterdir():
        if not (site / p.name).exists():
            (site / p.name).symlink_to(p)
    wh = tmp_path / "wheelhouse-sglang"
    wh.mkdir()
    _wheel(wh, "sglang", "0.5.21")
    (wh / "requirements.txt").write_text("sglang==0.5.21\n")
    stage, root = tmp_path / "stage", tmp_path / "root"
    gw.pack(wh, stage, "1K", name="wheelhouse-sglang")
    (stage / "wheelhouse.tar.part-000").write_text("the image's part: not the peers' to take")
    root.mkdir()
    env = {"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent), "STAGE": str(stage), "PEER_ROOT": str(root),
           "GPU_VENV": str(pip_venv), "PEERS": "sglang"}
    r = subprocess.run(["bash", "bench/e2e/runbook.sh", "peers"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    py = root / "venv-sglang" / "bin" / "python"
    assert py.exists(), out
    assert subprocess.run([str(py), "-c", "import sglang, torch; print(sglang.VERSION, torch.VERSION)"],
                          capture_output=True, text=True, check=True).stdout.split() == ["0.5.21", "2.13.0"]
    assert sorted(p.name for p in stage.iterdir()) == ["wheelhouse.tar.part-000"]  # its parts used and removed
    assert not (root / "wheelhouse-sglang").exists()  # and its wheelhouse (KEEP_PEER_WHEELS=1 keeps it)
    assert r.returncode == 1 and "[sglang] sglang: FAILED: sglang-kernel: lock 0.4.7, runtime missing" in out
    assert not (root / "venv-sglang" / "check-passed").exists()  # so `all` leaves its arm out


@pytest.mark.parametrize("subcommand", ["prep", "all", "e2e"])
def test_the_session_scripts_engine_steps_refuse_to_start_without_the_runs_models(tmp_path, subcommand):
    """bench/e2e/runbook.sh prep, all and e2e without E2E_ARGS would make (or serve) every preset model, which no
    lease's disk holds: each stops at once, saying what to give it, and touches nothing."""
    env = {"PATH": "/usr/bin:/bin", "RES": str(tmp_path / "results"), "STAGE": str(tmp_path / "stage")}
    r = subprocess.run(["bash", "bench/e2e/runbook.sh", subcommand], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and f"{subcommand}: E2E_ARGS is unset" in r.stderr, r.stderr
    assert ("ENGINE=0" in r.stderr) == (subcommand == "all"), r.stderr
    assert subcommand != "prep" or "`all`" in r.stderr, r.stderr  # prep is given the E2E_ARGS of the `all` after it
    assert not (tmp_path / "results").exists()


def test_the_session_scripts_all_with_engine_0_runs_the_kernel_steps_without_e2e_args(tmp_path):
    """ENGINE=0 (a lease too short for the engine bench): `all` needs no E2E_ARGS and goes on to install the image's
    runtime, which here stops it at the unpack step (no parts staged), with the steps in session.log; after a prep
    that is done it runs to its end without the engine bench and without installing the peers' runtimes (PEERS)."""
    res = tmp_path / "results"
    env = {"PATH": "/usr/bin:/bin", "RES": str(res), "STAGE": str(tmp_path / "stage"), "ENGINE": "0",
           "WH": str(tmp_path / "wheelhouse"), "GEMMS": "0", "KERNELS": "0"}
    r = subprocess.run(["bash", "bench/e2e/runbook.sh", "all"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    log = (res / "session.log").read_text()
    assert r.returncode == 1 and re.search(r"^=== \d+ s: unpack$", log, re.M), (r.stderr, log)
    assert "E2E_ARGS is unset" not in r.stderr + log and "engine benchmark" not in log
    (res / "session.log").unlink()
    (res / "prep.log").write_text("")
    (res / "PREP_DONE").touch()
    r = subprocess.run(["bash", "bench/e2e/runbook.sh", "all"], cwd=ROOT, env={**env, "PEERS": "sglang"},
                       capture_output=True, text=True, timeout=60)
    log = (res / "session.log").read_text()
    assert r.returncode == 0 and "ENGINE=0: no engine bench" in log and (res / "DONE").exists(), (r.stderr, log)
    assert "peer runtimes" not in log and "engine benchmark" not in log and "unpack" not in log
