"""The GPU runtime as files: resolve it once (a lock), download it as wheels, pack it in parts.

    python tools/gpu_wheelhouse.py lock                       # requirements/gpu.lock, smoke.lock (needs uv)
    python tools/gpu_wheelhouse.py download --dest DIR [--host-freeze FREEZE] [--skip NAME ...]
    python tools/gpu_wheelhouse.py pack --src DIR --parts DIR [--size 60M]

The lock is the complete, resolved GPU runtime for CPython 3.12 on manylinux x86_64 (the image's
Python): vLLM 0.32.0, torch 2.13.0 and everything they need, with the override in
requirements/gpu-overrides.txt. pip cannot apply that override (torch pins an NCCL the index
lacks), so everything that installs the GPU runtime (the Dockerfile, `make smoke`) installs the
lock as is, with --no-deps. uv resolves it because uv can override a dependency's pin.

`download` fetches every wheel of the lock (and of the smoke test's tools) into DIR and writes
DIR/requirements.txt, the exact pins it holds; `make smoke WHEELHOUSE=DIR` installs from there
with --no-index, which is also how an air-gapped GPU host gets the runtime. A host that already
has some of these packages (a CUDA image with torch's CUDA libraries, say) can leave them out:
--host-freeze takes that host's `pip freeze` and leaves out every package it has at the locked
version; --skip leaves out packages by name whatever their version (the caller vouches for them).
`pack` tars DIR and splits it into parts, for hosts that take files only in pieces.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Run as a script by the system python3 (`python3 tools/gpu_wheelhouse.py`), where serving.paths is not importable.
ROOT = Path(__file__).resolve().parent.parent
REQ = ROOT / "requirements"
LOCKS = (REQ / "gpu.lock", REQ / "smoke.lock")
# The image's platform: CPython 3.12, glibc 2.28 or newer (manylinux_2_28; the tags below are the
# ones the locked wheels carry).
PY = "3.12"
PLATFORMS = ["manylinux_2_" + str(n) + "_x86_64" for n in (35, 34, 31, 28, 27, 24, 17, 12)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "linux_x86_64"]
UV_PLATFORM = "x86_64-manylinux_2_28"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """name -> version from `name==version` lines (a lock, or a `pip freeze`)."""
    pins = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line.strip())
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def resolve(uv: str, src: Path, out: Path, python: str = PY, override: Path | None = None) -> int:
    """Resolve requirements file src for CPython `python` on manylinux x86_64 into the lock out."""
    cmd = [uv, "pip", "compile", str(src), "--python-version", python, "--python-platform", UV_PLATFORM,
           "--no-header", "--no-annotate"]
    if override:
        cmd += ["--override", str(override)]
    body = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    over = f" with requirements/{override.name}" if override else ""
    out.write_text(f"# The complete GPU runtime (CPython {python}, manylinux x86_64), resolved from requirements/"
                   f"{src.name}{over}.\n# Installed as is with pip --no-deps. Regenerate: make gpu-lock\n" + body)
    return len(read_pins(out))


def lock(uv: str) -> None:
    for src, out, override in (("gpu.txt", "gpu.lock", REQ / "gpu-overrides.txt"), ("smoke.txt", "smoke.lock", None)):
        print(f"requirements/{out}: {resolve(uv, REQ / src, REQ / out, PY, override)} packages")


def selection(host_freeze: Path | None, skip: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(wanted, left out): every locked pin, less what the host has at that version or --skip names."""
    wanted: dict[str, str] = {}
    for path in LOCKS:
        for name, version in read_pins(path).items():
            if wanted.setdefault(name, version) != version:
                raise SystemExit(f"{name}: {version} in {path.name} but {wanted[name]} in another lock")
    host = read_pins(host_freeze) if host_freeze else {}
    skip_names = {canonical(s) for s in skip}
    unknown = skip_names - set(wanted)
    if unknown:
        raise SystemExit(f"--skip {', '.join(sorted(unknown))}: not in the locks")
    left = {n: v for n, v in wanted.items() if n in skip_names or host.get(n) == v}
    return {n: v for n, v in wanted.items() if n not in left}, left


def download(dest: Path, host_freeze: Path | None, skip: list[str], jobs: int) -> None:
    wanted, left = selection(host_freeze, skip)
    dest.mkdir(parents=True, exist_ok=True)
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]

    def fetch(pin: str) -> str | None:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", PY, "--implementation", "cp", *platform_args, "-d", str(dest), pin]
        r = subprocess.run(cmd, capture_output=True, text=True)
        return None if r.returncode == 0 else f"{pin}: {r.stderr.strip().splitlines()[-1:]}"

    pins = [f"{n}=={v}" for n, v in sorted(wanted.items())]
    with ThreadPoolExecutor(jobs) as pool:
        failed = [f for f in pool.map(fetch, pins) if f]
    if failed:
        raise SystemExit("download failed:\n  " + "\n  ".join(failed))
    (dest / "requirements.txt").write_text(
        "# The pins this wheelhouse holds (tools/gpu_wheelhouse.py download).\n"
        + (f"# Left out (the host has them, or --skip named them): {' '.join(f'{n}=={v}' for n, v in sorted(left.items()))}\n" if left else "")
        + "".join(p + "\n" for p in pins))
    size = sum(f.stat().st_size for f in dest.glob("*.whl"))
    print(f"{dest}: {len(pins)} wheels, {size / 1e9:.2f} GB; left out {len(left)}: {', '.join(sorted(left)) or '-'}")


def pack(src: Path, parts: Path, size: str) -> None:
    parts.mkdir(parents=True, exist_ok=True)
    for old in parts.glob("wheelhouse.tar.part-*"):
        old.unlink()
    tar = parts / "wheelhouse.tar"
    with tarfile.open(tar, "w") as t:  # wheels are compressed already
        t.add(src, arcname="wheelhouse")
    subprocess.run(["split", "-b", size, "-d", "-a", "3", str(tar), str(parts / "wheelhouse.tar.part-")], check=True)
    tar.unlink()
    n = len(list(parts.glob("wheelhouse.tar.part-*")))
    print(f"{parts}: {n} parts; rejoin with: cat wheelhouse.tar.part-* | tar -x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/gpu_wheelhouse.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lk = sub.add_parser("lock", help="resolve requirements/gpu.lock and smoke.lock with uv")
    lk.add_argument("--uv", default=shutil.which("uv") or "uv")
    d = sub.add_parser("download", help="download the locked wheels")
    d.add_argument("--dest", type=Path, required=True)
    d.add_argument("--host-freeze", type=Path, default=None, help="`pip freeze` of the target host")
    d.add_argument("--skip", nargs="*", default=[], metavar="NAME", help="leave these out whatever their version")
    d.add_argument("--jobs", type=int, default=6)
    k = sub.add_parser("pack", help="tar a wheelhouse and split it into parts")
    k.add_argument("--src", type=Path, required=True)
    k.add_argument("--parts", type=Path, required=True)
    k.add_argument("--size", default="60M")
    a = p.parse_args(argv)
    if a.cmd == "lock":
        lock(a.uv)
    elif a.cmd == "download":
        download(a.dest, a.host_freeze, a.skip, a.jobs)
    else:
        pack(a.src, a.parts, a.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
