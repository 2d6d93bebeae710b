"""The GPU runtime as files: resolve it once (a lock), download it as wheels, pack it in parts.

    python tools/gpu_wheelhouse.py lock [--runtime R ...]     # requirements/gpu.lock, smoke.lock (needs uv)
    python tools/gpu_wheelhouse.py download --dest DIR [--runtime R] [--host-freeze FREEZE] [--skip NAME ...]
    python tools/gpu_wheelhouse.py pack --src DIR --parts DIR [--size 60M] [--name wheelhouse]

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

--runtime picks one of RUNTIMES (default "image", the above). The engine bench's peer arms each run from a runtime
of their own, resolved and downloaded the same way:
- "sglang": SGLang 0.5.21 (requirements/sglang.txt, sglang-overrides.txt -> sglang.lock), the last SGLang that pins
  torch 2.13.0, the image's torch. Its wheelhouse holds only what the image's runtime does not hold at the same
  version (its own transformers, flashinfer, sglang-kernel, ...): tools/peer_runtimes.py installs it with --target
  as a site of its own, in front of the image's packages (torch 2.13 and its CUDA libraries) less vLLM.
- "vllm-latest": stock vLLM 0.34.0 with torch 2.14.0 (requirements/vllm-latest.txt, vllm-latest-overrides.txt ->
  vllm-latest.lock), a whole runtime of its own: torch 2.14, its Triton, vLLM 0.34 and every package whose version
  differs from the image's; a package the image holds at the very same version is the same wheel, so it is left out
  of the wheelhouse too and read from the image's venv (tools/peer_runtimes.py).
- "sglang-latest": SGLang 0.5.23, the newest SGLang on the package index, with torch 2.14.1
  (requirements/sglang-latest.txt, sglang-latest-overrides.txt -> sglang-latest.lock), a whole runtime of its own
  as "vllm-latest" is.
Each leaves out torchaudio (their pins name torchaudio 2.11.0, built for torch 2.11) through its overrides file.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# Run as a script by the system python3 (`python3 tools/gpu_wheelhouse.py`), where serving.paths is not importable.
ROOT = Path(__file__).resolve().parent.parent
REQ = ROOT / "requirements"
# The image's platform: CPython 3.12, glibc 2.28 or newer (manylinux_2_28; the tags below are the
# ones the locked wheels carry).
PY = "3.12"
PLATFORMS = ["manylinux_2_" + str(n) + "_x86_64" for n in (35, 34, 31, 28, 27, 24, 18, 17, 12)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "linux_x86_64"]
UV_PLATFORM = "x86_64-manylinux_2_28"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)")


@dataclass(frozen=True)
class Runtime:
    """One Python runtime of the GPU host, as locks resolved from requirements files (all under requirements/).

    sources: (requirements file, lock, overrides file or None) per lock; platform: uv's target platform;
    prerelease: uv's --prerelease (None: its default); beside: the runtime whose installed packages this one reads
    too, so that its wheelhouse leaves out what that one holds at the same version."""
    name: str
    sources: tuple[tuple[str, str, str | None], ...]
    platform: str = UV_PLATFORM
    prerelease: str | None = None
    beside: str | None = None

    @property
    def locks(self) -> tuple[Path, ...]:
        return tuple(REQ / lock for _, lock, _ in self.sources)


RUNTIMES = {r.name: r for r in (
    Runtime("image", (("gpu.txt", "gpu.lock", "gpu-overrides.txt"), ("smoke.txt", "smoke.lock", None))),
    # sglang 0.5.21's wheel is manylinux_2_34 (the H200 host's glibc is newer); it pins two pre-releases itself
    Runtime("sglang", (("sglang.txt", "sglang.lock", "sglang-overrides.txt"),), platform="x86_64-manylinux_2_34",
            prerelease="if-necessary-or-explicit", beside="image"),
    Runtime("vllm-latest", (("vllm-latest.txt", "vllm-latest.lock", "vllm-latest-overrides.txt"),), beside="image"),
    # sglang 0.5.23's wheel is manylinux_2_34 too, and it asks for a pre-release of flash-attn-4 as 0.5.21 does
    Runtime("sglang-latest", (("sglang-latest.txt", "sglang-latest.lock", "sglang-latest-overrides.txt"),),
            platform="x86_64-manylinux_2_34", prerelease="if-necessary-or-explicit", beside="image"),
)}
LOCKS = RUNTIMES["image"].locks


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


def resolve(uv: str, src: Path, out: Path, python: str = PY, override: Path | None = None,
            platform: str = UV_PLATFORM, prerelease: str | None = None, regenerate: str = "make gpu-lock") -> int:
    """Resolve requirements file src for CPython `python` on manylinux x86_64 into the lock out."""
    cmd = [uv, "pip", "compile", str(src), "--python-version", python, "--python-platform", platform,
           "--no-header", "--no-annotate"]
    if override:
        cmd += ["--override", str(override)]
    if prerelease:
        cmd += ["--prerelease", prerelease]
    body = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    over = f" with requirements/{override.name}" if override else ""
    plat = "manylinux" if platform == UV_PLATFORM else platform.split("-", 1)[1]
    out.write_text(f"# The complete GPU runtime (CPython {python}, {plat} x86_64), resolved from "
                   f"requirements/{src.name}{over}.\n# Installed as is with pip --no-deps. Regenerate: {regenerate}\n"
                   + body)
    return len(read_pins(out))


def lock(uv: str, runtimes: tuple[str, ...] = ("image",)) -> None:
    for name in runtimes:
        rt = RUNTIMES[name]
        again = "make gpu-lock" if name == "image" else f"python tools/gpu_wheelhouse.py lock --runtime {name}"
        for src, out, override in rt.sources:
            n = resolve(uv, REQ / src, REQ / out, PY, REQ / override if override else None, rt.platform,
                        rt.prerelease, again)
            print(f"requirements/{out}: {n} packages")


def locked(runtime: str = "image") -> dict[str, str]:
    """Every pin of a runtime's locks (one version per package across them)."""
    pins: dict[str, str] = {}
    for path in RUNTIMES[runtime].locks:
        for name, version in read_pins(path).items():
            if pins.setdefault(name, version) != version:
                raise SystemExit(f"{name}: {version} in {path.name} but {pins[name]} in another lock")
    return pins


def selection(host_freeze: Path | None, skip: list[str], runtime: str = "image") -> tuple[dict[str, str], dict[str, str]]:
    """(wanted, left out): every locked pin of the runtime, less what the runtime it sits beside holds at that
    version, what the host has at that version, or --skip names."""
    wanted = locked(runtime)
    beside = RUNTIMES[runtime].beside
    shared = locked(beside) if beside else {}
    host = read_pins(host_freeze) if host_freeze else {}
    skip_names = {canonical(s) for s in skip}
    unknown = skip_names - set(wanted)
    if unknown:
        raise SystemExit(f"--skip {', '.join(sorted(unknown))}: not in the locks")
    left = {n: v for n, v in wanted.items() if n in skip_names or host.get(n) == v or shared.get(n) == v}
    return {n: v for n, v in wanted.items() if n not in left}, left


def download(dest: Path, host_freeze: Path | None, skip: list[str], jobs: int, runtime: str = "image") -> None:
    wanted, left = selection(host_freeze, skip, runtime)
    beside = RUNTIMES[runtime].beside
    shared = locked(beside) if beside else {}  # read once, not once per package left out
    from_beside = {n for n, v in left.items() if shared.get(n) == v}
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
    others = {n: v for n, v in left.items() if n not in from_beside}
    (dest / "requirements.txt").write_text(
        f"# The pins this wheelhouse holds (tools/gpu_wheelhouse.py download --runtime {runtime}).\n"
        + (f"# Left out, the {beside} runtime's at the same version: "
           f"{' '.join(f'{n}=={left[n]}' for n in sorted(from_beside))}\n" if from_beside else "")
        + (f"# Left out (the host has them, or --skip named them): {' '.join(f'{n}=={v}' for n, v in sorted(others.items()))}\n" if others else "")
        + "".join(p + "\n" for p in pins))
    size = sum(f.stat().st_size for f in dest.glob("*.whl"))
    print(f"{dest}: {len(pins)} wheels, {size / 1e9:.2f} GB; left out {len(left)}"
          + (f" ({len(from_beside)} the {beside} runtime's)" if from_beside else "")
          + f": {', '.join(sorted(others)) or '-'}")


def pack(src: Path, parts: Path, size: str, name: str = "wheelhouse") -> None:
    """src as the tar folder `name`, in parts parts/NAME.tar.part-000, -001, ... (a name per runtime, so that the
    parts of several wheelhouses can be staged in one folder)."""
    parts.mkdir(parents=True, exist_ok=True)
    for old in parts.glob(f"{name}.tar.part-*"):
        old.unlink()
    tar = parts / f"{name}.tar"
    with tarfile.open(tar, "w") as t:  # wheels are compressed already
        t.add(src, arcname=name)
    subprocess.run(["split", "-b", size, "-d", "-a", "3", str(tar), str(parts / f"{name}.tar.part-")], check=True)
    tar.unlink()
    n = len(list(parts.glob(f"{name}.tar.part-*")))
    print(f"{parts}: {n} parts; rejoin with: cat {name}.tar.part-* | tar -x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/gpu_wheelhouse.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lk = sub.add_parser("lock", help="resolve requirements/gpu.lock and smoke.lock with uv")
    lk.add_argument("--uv", default=shutil.which("uv") or "uv")
    lk.add_argument("--runtime", nargs="+", default=["image"], choices=sorted(RUNTIMES))
    d = sub.add_parser("download", help="download the locked wheels")
    d.add_argument("--dest", type=Path, required=True)
    d.add_argument("--runtime", default="image", choices=sorted(RUNTIMES))
    d.add_argument("--host-freeze", type=Path, default=None, help="`pip freeze` of the target host")
    d.add_argument("--skip", nargs="*", default=[], metavar="NAME", help="leave these out whatever their version")
    d.add_argument("--jobs", type=int, default=6)
    k = sub.add_parser("pack", help="tar a wheelhouse and split it into parts")
    k.add_argument("--src", type=Path, required=True)
    k.add_argument("--parts", type=Path, required=True)
    k.add_argument("--size", default="60M")
    k.add_argument("--name", default="wheelhouse", help="the tar's folder and the parts' names (one per runtime)")
    a = p.parse_args(argv)
    if a.cmd == "lock":
        lock(a.uv, a.runtime)
    elif a.cmd == "download":
        download(a.dest, a.host_freeze, a.skip, a.jobs, a.runtime)
    else:
        pack(a.src, a.parts, a.size, a.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
