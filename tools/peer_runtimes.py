"""The engine bench's peer runtimes on the GPU host: SGLang 0.5.21 (the "sglang" arm), stock vLLM 0.34.0 on torch
2.14 (the "vllm-latest" arm) and SGLang 0.5.23 on torch 2.14.1 (the "sglang-latest" arm), each a venv of its own
beside the image's venv (make gpu-venv), from its wheelhouse (tools/gpu_wheelhouse.py download --runtime R).

    python3 tools/peer_runtimes.py install sglang --wheelhouse W --image-venv /root/venv-gpu --venv /root/venv-sglang
    python3 tools/peer_runtimes.py install vllm-latest --wheelhouse W --image-venv /root/venv-gpu \
        --venv /root/venv-vllm-latest
    python3 tools/peer_runtimes.py check sglang --python /root/venv-sglang/bin/python

All are made the same way (sglang-latest as vllm-latest), and the last line printed is the venv's Python
(bench/e2e's --sglang-python, --vllm-latest-python, --sglang-latest-python):
1. a venv without pip, of the image venv's own base Python (CPython 3.12);
2. the wheelhouse's pins (W/requirements.txt) installed into its site-packages as they are: pip --no-index --no-deps
   --target (the image venv's pip). A wheelhouse of a runtime beside the image holds only what the image's runtime
   does not hold at the same version: SGLang's own transformers, FlashInfer, sglang-kernel, ...; vLLM 0.34 with
   torch 2.14, Triton 3.8 and the rest that differs; SGLang 0.5.23 with torch 2.14.1 and the rest that differs;
3. behind its own packages (a .pth, so they come after them on the path), what it shares with the image:
   VENV/image-site, a folder of links to the image venv's packages but vLLM (the image's, patched: neither peer may
   see it) and the metadata of projects the venv holds itself, so that each project has one version's metadata;
   then the image venv's host-site, the host's own packages (the CUDA libraries every wheelhouse leaves out).
   image-site is added as a site directory, so that the .pth files of the image's packages take effect there as in
   the image (nvidia-cutlass-dsl puts its `cutlass` module on the path by one; vLLM 0.34 imports it while it warms
   up). The runtime's .pth is named to be read after every other of its site (site reads them in name order): a
   package the runtime holds itself comes first on the path, its .pth's folders included.
A package in the venv shadows the image's of the same name (torch 2.14 over 2.13, transformers 5.12.1 over 5.19.0):
what each runtime imports is its own lock's version, read from its own site or, at that very version, the image's.
`check` asks the runtime's Python for the version of every package of its lock (requirements/R.lock) and fails
when an engine package (KEY) differs or the image's vLLM is visible to an SGLang runtime; other differences (the
host's CUDA libraries, which every wheelhouse leaves out) are listed.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

if __package__:  # imported as tools.peer_runtimes
    from .gpu_wheelhouse import canonical, locked as read_lock
else:  # run as a script by the host's python3 (tools/ first on its path)
    from gpu_wheelhouse import canonical, locked as read_lock

# What each peer runtime must never read from the image's venv: the image's vLLM (0.32 with the patch series).
NOT_SHARED = ("vllm",)
PTH = "zzz_peer_runtime.pth"  # read last of the runtime's .pth files: its own packages' paths come first
DIST_INFO = re.compile(r"^(.+?)-[^-]+\.(dist-info|egg-info)$")
SGLANG_RUNTIMES = ("sglang", "sglang-latest")  # each SGLang runtime is made and checked alike
RUNTIMES = ("sglang", "vllm-latest", "sglang-latest")
# The packages whose version decides what a peer runs: each must be its lock's, or `check` fails.
KEY = {**dict.fromkeys(SGLANG_RUNTIMES, ("sglang", "sglang-kernel", "torch", "triton", "transformers",
                                         "flashinfer-python", "sgl-deep-gemm", "nvidia-nccl-cu13")),
       "vllm-latest": ("vllm", "torch", "triton", "transformers", "flashinfer-python", "torchvision",
                       "nvidia-nccl-cu13")}
# The modules each peer's server imports that it must find on its path: metadata alone does not show a module that
# a .pth file puts on the path (nvidia-cutlass-dsl's `cutlass`, imported by vLLM 0.34's warm-up).
MODULES = {**dict.fromkeys(SGLANG_RUNTIMES, ("sglang", "sgl_kernel", "deep_gemm", "flashinfer", "cutlass")),
           "vllm-latest": ("vllm", "flashinfer", "cutlass")}
# Run by the runtime's Python with MODULES[runtime] as its arguments: every installed distribution's version (the
# first on the path wins, as for imports), whether `import vllm` would find a module, and which of the arguments it
# would not find (found without importing them: the check runs where no GPU is too).
PROBE = """import importlib.metadata as md, importlib.util, json, re, sys
seen = {}
for d in md.distributions():
    name = re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower()
    seen.setdefault(name, d.version)
print(json.dumps({"versions": seen, "vllm": importlib.util.find_spec("vllm") is not None,
                  "unfound": [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]}))
"""


def projects(site: Path) -> set[str]:
    """The canonical names of the projects a site-packages folder holds (its .dist-info folders)."""
    return {canonical(m.group(1)) for p in site.iterdir() if (m := DIST_INFO.match(p.name))}


def purelib(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())


def shared_entries(image_site: Path, own: set[str]) -> list[Path]:
    """The entries of the image venv's site-packages a peer runtime reads behind its own packages: all but vLLM
    (module and metadata), the metadata of projects the runtime holds itself (`own`), the image's link to its
    host-site (the runtime lists that itself, last) and bytecode caches."""
    keep = []
    for p in sorted(image_site.iterdir()):
        m = DIST_INFO.match(p.name)
        project = canonical(m.group(1)) if m else None
        if p.name in NOT_SHARED or project in NOT_SHARED or project in own:
            continue
        if p.name in ("_host_site.pth", "__pycache__"):
            continue
        keep.append(p)
    return keep


def link_shared(image_site: Path, own_site: Path, dest: Path) -> int:
    """dest: a folder of links to shared_entries (made anew). Returns how many."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    entries = shared_entries(image_site, projects(own_site))
    for p in entries:
        (dest / p.name).symlink_to(p)
    return len(entries)


def install(runtime: str, wheelhouse: Path, image_venv: Path, venv: Path,
            run: Callable[..., object] = subprocess.run) -> Path:
    """Make `venv` for `runtime` from `wheelhouse` beside `image_venv` (the module docstring's three steps); returns
    its Python."""
    image_py = image_venv / "bin" / "python"
    reqs = wheelhouse / "requirements.txt"
    if not reqs.is_file():
        raise SystemExit(f"{runtime}: {reqs} is missing (tools/gpu_wheelhouse.py download --runtime {runtime})")
    if venv.exists():
        shutil.rmtree(venv)
    run([str(image_py), "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = purelib(py)
    run([str(image_py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links",
         str(wheelhouse), "--target", str(site), "-r", str(reqs)], check=True)
    n = link_shared(purelib(image_py), site, venv / "image-site")
    lines = [f"import site; site.addsitedir({str(venv / 'image-site')!r})"]
    host_site = image_venv / "host-site"
    if host_site.is_dir():
        lines.append(str(host_site))
    (site / PTH).write_text("".join(line + "\n" for line in lines))
    print(f"{runtime}: {len(projects(site))} projects of its own in {site}, {n} entries of {image_venv}'s shared "
          f"behind them{', then its host-site' if host_site.is_dir() else ''}")
    return py


def compare(runtime: str, versions: dict[str, str], vllm_visible: bool,
            unfound: list[str] = ()) -> tuple[list[str], list[str]]:
    """(failures, notes): the runtime's versions (name -> version, as its Python sees them) against its lock, and the
    modules of MODULES[runtime] its Python does not find."""
    failures, notes = [f"module {m}: not found on the runtime's path" for m in unfound], []
    for name, want in sorted(read_lock(runtime).items()):
        got = versions.get(name)
        if got == want:
            continue
        line = f"{name}: lock {want}, runtime {got or 'missing'}"
        (failures if name in KEY[runtime] else notes).append(line)
    if runtime in SGLANG_RUNTIMES and vllm_visible:
        failures.append("vllm: importable in SGLang's runtime (the image's patched vLLM must stay out of it)")
    return failures, notes


def check(runtime: str, python: Path) -> int:
    import json

    r = subprocess.run([str(python), "-c", PROBE, *MODULES[runtime]], capture_output=True, text=True)
    if r.returncode:
        print(f"{runtime}: {python} failed: {r.stderr.strip()[-2000:]}")
        return 1
    probe = json.loads(r.stdout)
    failures, notes = compare(runtime, probe["versions"], probe["vllm"], probe["unfound"])
    for line in notes:
        print(f"{runtime}: note: {line}")
    for line in failures:
        print(f"{runtime}: FAILED: {line}")
    print(f"{runtime}: " + ", ".join(f"{k} {probe['versions'].get(k, 'missing')}" for k in KEY[runtime]))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/peer_runtimes.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="make a peer runtime's venv from its wheelhouse")
    i.add_argument("runtime", choices=RUNTIMES)
    i.add_argument("--wheelhouse", type=Path, required=True)
    i.add_argument("--image-venv", type=Path, required=True, help="the image's venv (make gpu-venv)")
    i.add_argument("--venv", type=Path, required=True, help="the venv to make (replaced if there)")
    c = sub.add_parser("check", help="the runtime's versions against its lock")
    c.add_argument("runtime", choices=RUNTIMES)
    c.add_argument("--python", type=Path, required=True)
    a = p.parse_args(argv)
    if a.cmd == "check":
        return check(a.runtime, a.python)
    print(install(a.runtime, a.wheelhouse, a.image_venv, a.venv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
