"""Build and run the CPU flavour of the project's Dockerfile without a Docker engine (buildah).

    python3 -m tools.image_build patches      # the PATCHES build arg (from patches/series)
    python3 -m tools.image_build tools        # apt-get install buildah debootstrap if missing
    python3 -m tools.image_build base         # make the local Debian base image (cached)
    python3 -m tools.image_build build [TAG] [--head]  # build the CPU flavour of the Dockerfile
                                              # (--head: of the committed tree, not the checkout)
    python3 -m tools.image_build gpu [--keep] # build the GPU flavour here and check inside it (no GPU needed)
    python3 -m tools.image_build clean [--all] # remove what this made (--all: the base and caches too)

tests/test_image.py (`make image-test`) drives the same functions: tools, base, build, a
container with the embedded tiny model, smoke checks, cleanup.

How it works on a machine with no Docker engine and no image registry:
- base: `debootstrap --variant=minbase` makes a Debian bookworm root with python3, venv and CA
  certificates from the Debian mirror named in this machine's apt sources; buildah commits it
  as localhost/lmi-base:bookworm (buildah 1.28 has no `import`: from scratch, mount, copy,
  commit). Made once; later runs reuse it.
- build: `buildah bud --storage-driver vfs --isolation chroot --format docker` of the real
  Dockerfile with the CPU build arguments. RUN steps share the host network. Where this host's
  pip finds wheels in local folders (find-links; torch 2.13.0+cpu is one) or trusts an extra
  CA certificate, those are mounted into the build read-only (`-v`) and named in
  PIP_INSTALL_OPTS; they are never copied into the image. Every build downloads the Python
  dependencies again (no pip cache survives a build).
- run: `buildah run --isolation chroot` of the image's own ENTRYPOINT + CMD, as the image's
  user, on the host network (OPTION_HOST=127.0.0.1, OPTION_PORT=<free port>).

Storage: buildah's vfs driver copies whole layers; the built image is about 4 GB and the
working container another copy while it runs. Everything but the base and the caches is
removed afterwards.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from serving.paths import ROOT
from serving.vllm_patches.series import load_series

BASE_IMAGE = "localhost/lmi-base:bookworm"
TEST_IMAGE = "localhost/lmi-fp8-moe:cpu-test"
GPU_TEST_IMAGE = "localhost/lmi-fp8-moe:gpu-test"
SUITE = "bookworm"
BUILDAH = ["buildah", "--storage-driver", "vfs"]
# Host-side scratch (the debootstrap root while the base is made, a HEAD build context).
CACHE = Path(os.environ.get("LMI_IMAGE_TEST_CACHE") or Path.home() / ".cache" / "lmi-image-test")
# The CPU flavour: these build arguments, and nothing else, differ from the GPU image.
CPU_BUILD_ARGS = {
    "BASE_IMAGE": BASE_IMAGE,
    "REQUIREMENTS": "requirements/cpu.txt",
    "PIP_DEPS": "",
    "PIP_UNINSTALL": "torchvision torchaudio torchcodec",
}
# The GPU flavour as built here: the image's own GPU build arguments (the Dockerfile's defaults),
# except the base: nvidia/cuda cannot be pulled here, so the local Debian base stands in (with
# its Python 3.11; see build_gpu). It cannot serve without a GPU; `gpu` checks what can be
# checked inside it.
GPU_BUILD_ARGS = {"BASE_IMAGE": BASE_IMAGE, "REQUIREMENTS": "requirements/gpu.lock", "PIP_DEPS": "--no-deps",
                  "PIP_UNINSTALL": ""}
GPU_CHECKS = (
    ("patch record", ["python", "-m", "serving.vllm_patches", "check"]),
    ("imports", ["python", "-c", "import torch, vllm, torchvision; print('torch', torch.__version__, 'CUDA', "
                 "torch.version.cuda, 'vllm', vllm.__version__, 'torchvision', torchvision.__version__)"]),
    ("dry run", ["python", "-m", "serving", "--dry-run"]),
)


def log(msg: str) -> None:
    print(f"[image] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    log("$ " + shlex.join(cmd))
    return subprocess.run(cmd, check=True, **kw)


def out(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


# ---------------------------------------------------------------------------------------------
# Build arguments derived from the repository
# ---------------------------------------------------------------------------------------------

def series_patches(root: Path = ROOT) -> str:
    """The PATCHES build arg: patch names of patches/series (without .patch), comma-separated."""
    return ",".join(p.name.removesuffix(".patch") for p in load_series(root / "patches").patches)


def series_vllm_version(root: Path = ROOT) -> str:
    return load_series(root / "patches").vllm_version


def vcs_ref(worktree: bool = True) -> str:
    try:
        ref = out(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"]).strip()
        dirty = worktree and subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"]).returncode
        return ref + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Tools and the base image
# ---------------------------------------------------------------------------------------------

def ensure_tools() -> None:
    missing = [t for t in ("buildah", "debootstrap") if shutil.which(t) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"{', '.join(missing)} missing; install with: apt-get install -y buildah debootstrap")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sh(["apt-get", "update", "-q"], env=env)
    sh(["apt-get", "install", "-y", "-q", "buildah", "debootstrap"], env=env)


def _apt_sources() -> list[tuple[list[str], list[str]]]:
    """(URIs, suites) of every deb entry in this machine's apt sources (one-line and deb822)."""
    entries = []
    src = Path("/etc/apt")
    files = [src / "sources.list"] + sorted((src / "sources.list.d").glob("*.list"))
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            line = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                entries.append(([line[1]], [line[2]]))
    for f in sorted((src / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", f.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                k, v = line.split(":", 1)
                fields[k.strip().lower()] = v.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                entries.append((fields.get("uris", "").split(), fields.get("suites", "").split()))
    return entries


def debian_mirror(suite: str = SUITE) -> str:
    """The Debian mirror this machine's apt uses for `suite` (read at run time, never hard-coded)."""
    for uris, suites in _apt_sources():
        if suite in suites:
            for uri in uris:
                if "security" not in uri:
                    return uri.rstrip("/")
    raise RuntimeError(f"no apt source for Debian {suite} in /etc/apt; cannot debootstrap")


def image_exists(name: str) -> bool:
    return subprocess.run(BUILDAH + ["inspect", "--type", "image", name],
                          capture_output=True).returncode == 0


def ensure_base(name: str = BASE_IMAGE, rebuild: bool = False) -> None:
    """Debian bookworm minbase + python3 + venv + CA certificates, committed as `name` (cached)."""
    if image_exists(name) and not rebuild:
        log(f"base image {name} present (cached)")
        return
    mirror = debian_mirror()
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=CACHE))
    rootfs = work / "rootfs"
    ctr = None
    try:
        sh(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
            SUITE, str(rootfs), mirror], stdout=subprocess.DEVNULL)
        # debootstrap leaves the host's resolv.conf/hostname decisions to the runtime.
        ctr = out(BUILDAH + ["from", "scratch"]).strip()
        mnt = out(BUILDAH + ["mount", ctr]).strip()
        sh(["cp", "-a", f"{rootfs}/.", mnt])
        sh(BUILDAH + ["umount", ctr])
        sh(BUILDAH + ["config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                      "--env", "LANG=C.UTF-8", "--cmd", "/bin/bash",
                      "--label", f"lmi-fp8-moe.base=debootstrap {SUITE} minbase", ctr])
        sh(BUILDAH + ["commit", "--rm", "--format", "docker", ctr, name], stdout=subprocess.DEVNULL)
        ctr = None
    finally:
        if ctr:
            subprocess.run(BUILDAH + ["rm", ctr], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Building the CPU flavour
# ---------------------------------------------------------------------------------------------

def _pip_config(key: str) -> list[str]:
    """A setting of this host's pip (env PIP_<KEY> first, then `pip config`), split on spaces."""
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env:
        return env.split()
    for scope in ("global", "user", "site"):
        r = subprocess.run([sys.executable, "-m", "pip", "config", "get", f"{scope}.{key}"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.split()
    return []


def host_build_inputs(wheels: bool = True) -> tuple[list[str], list[str]]:
    """(buildah -v options, pip options) that give the build this host's wheel folders and CA.

    wheels=False: the CA only (the GPU flavour: the host's wheel folder holds a CPU torch)."""
    vols, opts = [], []
    folders = _pip_config("find-links") if wheels else []
    for i, d in enumerate(p for p in folders if not re.match(r"^[a-z]+://", p)):
        if Path(d).is_dir():
            vols += ["-v", f"{Path(d).resolve()}:/run/lmi-build/wheels{i}:ro"]
            opts += ["--find-links", f"/run/lmi-build/wheels{i}"]
    cert = (_pip_config("cert") or [os.environ.get("SSL_CERT_FILE", "")])[0]
    if cert and Path(cert).is_file():
        vols += ["-v", f"{Path(cert).resolve()}:/run/lmi-build/ca.crt:ro"]
        opts += ["--cert", "/run/lmi-build/ca.crt"]
    # No pip cache: pip 23 (bookworm's) wrote nothing into a cache folder mounted into the
    # build, and one left inside the image would only make it bigger.
    opts.append("--no-cache-dir")
    return vols, opts


def build_args(pip_opts: list[str] = (), extra: dict[str, str] | None = None,
               context: Path = ROOT) -> dict[str, str]:
    """Every --build-arg of the CPU flavour: CPU_BUILD_ARGS plus the values derived from the repo."""
    opts = list(pip_opts)
    args = dict(CPU_BUILD_ARGS)
    args.update({"PATCHES": series_patches(context), "VLLM_VERSION": series_vllm_version(context),
                 "VCS_REF": vcs_ref(worktree=context == ROOT), "PIP_INSTALL_OPTS": " ".join(opts)})
    args.update(extra or {})
    return args


def head_context(dest: Path) -> Path:
    """The committed tree (git HEAD) as a build context: what CI and a fresh clone build."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise RuntimeError("git archive HEAD failed")
    for d in ("configs",):  # git keeps no empty folders; the Dockerfile copies this one
        if not (dest / d).is_dir():
            log(f"warning: {d}/ is not in HEAD; building with an empty {d}/")
            (dest / d).mkdir()
    return dest


def build(tag: str = TEST_IMAGE, extra_args: dict[str, str] | None = None, log_path: Path | None = None,
          context: str | None = None, host_wheels: bool = True) -> None:
    """`buildah bud` the CPU flavour of the Dockerfile.

    context: "worktree" (default; the checkout as it is, as `docker build .` would send it) or
    "head" (the committed tree only: another person's uncommitted work in a shared checkout
    stays out) or a folder holding a Dockerfile. Env IMAGE_TEST_CONTEXT sets the default.
    """
    context = context or os.environ.get("IMAGE_TEST_CONTEXT", "worktree")
    tmp = None
    if context == "head":
        tmp = Path(tempfile.mkdtemp(prefix="context-", dir=CACHE))
        ctx = head_context(tmp)
    elif context == "worktree":
        ctx = ROOT
    elif Path(context).is_dir() and (Path(context) / "Dockerfile").is_file():
        ctx = Path(context).resolve()  # a prepared context (e.g. an exported tree)
    else:
        raise ValueError(f"context must be worktree, head or a folder with a Dockerfile, not {context!r}")
    try:
        vols, opts = host_build_inputs(host_wheels)
        cmd = BUILDAH + ["bud", "--isolation", "chroot", "--format", "docker", "--layers=false", "--force-rm",
                         "-f", str(ctx / "Dockerfile"), "-t", tag] + vols
        for k, v in build_args(opts, extra_args, ctx).items():
            cmd += ["--build-arg", f"{k}={v}"]
        cmd.append(str(ctx))
        if log_path is None:
            sh(cmd)
            return
        log(f"$ {shlex.join(cmd)}  (log: {log_path})")
        with open(log_path, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if r.returncode:
            raise RuntimeError(f"image build failed ({r.returncode}):\n{log_path.read_text(errors='replace')[-6000:]}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def inspect(name: str) -> dict:
    return json.loads(out(BUILDAH + ["inspect", "--type", "image", name]))


def image_config(name: str) -> dict:
    """The image's Docker config (Entrypoint, Cmd, Env, User, ExposedPorts, Healthcheck, Labels)."""
    return inspect(name).get("Docker", {}).get("config", {})


# ---------------------------------------------------------------------------------------------
# Running a container
# ---------------------------------------------------------------------------------------------

@dataclass
class Container:
    name: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def exec(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """Run another process in the same container (same root, user and environment)."""
        return run_in(self.name, argv, timeout)

    def descendants(self) -> list[int]:
        return _descendants(self.proc.pid)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM to the image's PID-1 process (tini), then wait; SIGKILL what is left."""
        if self.proc.poll() is None:
            pids = self.descendants()
            init = _first_with_cmd(pids, "tini") or self.proc.pid
            _signal(init, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for pid in [self.proc.pid] + self.descendants():
                    _signal(pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def remove(self) -> None:
        subprocess.run(BUILDAH + ["rm", self.name], capture_output=True)


def run_in(container: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run argv in a working container (its root, user and environment), output captured."""
    return subprocess.run(BUILDAH + ["run", "--isolation", "chroot", container, "--"] + argv,
                          capture_output=True, text=True, timeout=timeout)


@contextmanager
def scratch_container(image: str):
    """A working container of `image` for run_in, removed afterwards."""
    name = out(BUILDAH + ["from", image]).strip()
    try:
        yield name
    finally:
        subprocess.run(BUILDAH + ["rm", name], capture_output=True)


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def _descendants(pid: int) -> list[int]:
    out_, todo = [], [pid]
    while todo:
        for k in _children(todo.pop()):
            out_.append(k)
            todo.append(k)
    return out_


def _first_with_cmd(pids: list[int], name: str) -> int | None:
    for pid in pids:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if os.path.basename(argv0) == name:
            return pid
    return None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def start(image: str, env: dict[str, str], log_path: Path, argv: list[str] | None = None) -> Container:
    """A container from `image` running its own ENTRYPOINT + CMD (or ENTRYPOINT + argv)."""
    cfg = image_config(image)
    entry, cmd = cfg.get("Entrypoint") or [], cfg.get("Cmd") or []
    name = out(BUILDAH + ["from", "--pull-never", image]).strip()
    try:
        if env:
            opts = []
            for k, v in env.items():
                opts += ["--env", f"{k}={v}"]
            sh(BUILDAH + ["config"] + opts + [name], stdout=subprocess.DEVNULL)
        full = entry + (cmd if argv is None else argv)
        log(f"container {name}: {shlex.join(full)} (log: {log_path})")
        f = open(log_path, "w")
        proc = subprocess.Popen(BUILDAH + ["run", "--isolation", "chroot", name, "--"] + full,
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        f.close()
    except BaseException:
        subprocess.run(BUILDAH + ["rm", name], capture_output=True)
        raise
    return Container(name, proc, log_path)


def remove_image(name: str) -> None:
    subprocess.run(BUILDAH + ["rmi", "-f", name], capture_output=True)


def clean(all_: bool = False) -> None:
    """Remove working containers of our images, the test image; with all_, the base and caches."""
    names = {TEST_IMAGE} | ({BASE_IMAGE} if all_ else set())
    try:
        ctrs = json.loads(out(BUILDAH + ["containers", "--json"]) or "[]") or []  # "null" when none
    except (subprocess.CalledProcessError, ValueError):
        ctrs = []
    for c in ctrs:
        img = c.get("imagename", "")
        if any(img.endswith(n.split("/", 1)[1]) for n in names):
            subprocess.run(BUILDAH + ["rm", c.get("containername") or c.get("id")], capture_output=True)
    for n in names:
        remove_image(n)
    if all_:
        shutil.rmtree(CACHE, ignore_errors=True)


def build_gpu(keep: bool = False) -> int:
    """Build the GPU flavour (GPU_BUILD_ARGS), run GPU_CHECKS in it, print time and size.

    requirements/gpu.lock is resolved for the image's CPython 3.12, which no Debian release has; the
    build here resolves the same requirements and override for the base's Python instead (with uv,
    as `make gpu-lock` does) into a copy of the committed tree. It checks the GPU flavour's build
    steps and its contents, not the exact wheel set the image ships (the H200 run installs that one)."""
    from tools import gpu_wheelhouse

    ensure_tools()
    ensure_base()
    uv = shutil.which("uv") or str(ROOT / ".venv" / "bin" / "uv")
    if not Path(uv).exists():
        raise SystemExit("uv is needed to resolve the GPU runtime for the base's Python: run `make gpu-lock` once")
    with scratch_container(BASE_IMAGE) as ctr:
        r = run_in(ctr, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    if r.returncode:
        raise RuntimeError(f"python3 in {BASE_IMAGE} failed: {r.stderr.strip()[-500:]}")
    py = r.stdout.strip()
    CACHE.mkdir(parents=True, exist_ok=True)
    ctx = head_context(Path(tempfile.mkdtemp(prefix="gpu-context-", dir=CACHE)))
    try:
        req = ctx / "requirements"
        n = gpu_wheelhouse.resolve(uv, req / "gpu.txt", req / "gpu.lock", py, req / "gpu-overrides.txt")
        log(f"GPU runtime resolved for the base's Python {py}: {n} packages")
        t0 = time.monotonic()
        build(GPU_TEST_IMAGE, extra_args=GPU_BUILD_ARGS, context=str(ctx), host_wheels=False)
        log(f"GPU flavour built in {time.monotonic() - t0:.0f} s")
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    sizes = out(BUILDAH + ["images", "--format", "{{.Name}}:{{.Tag}} {{.Size}}"])
    log("image size: " + next((ln for ln in sizes.splitlines() if ln.startswith(GPU_TEST_IMAGE)), "?"))
    failed = 0
    try:
        with scratch_container(GPU_TEST_IMAGE) as ctr:
            for name, argv in GPU_CHECKS:
                r = run_in(ctr, argv, timeout=600)
                failed += r.returncode != 0
                log(f"check {name}: {'ok' if r.returncode == 0 else f'FAILED ({r.returncode})'}\n"
                    + (r.stdout + r.stderr).strip()[-1500:])
    finally:
        if not keep:
            remove_image(GPU_TEST_IMAGE)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    what = argv[0]
    if what == "patches":
        print(series_patches())
    elif what == "tools":
        ensure_tools()
    elif what == "base":
        ensure_tools()
        ensure_base(rebuild="--rebuild" in argv)
    elif what == "build":
        ensure_tools()
        ensure_base()
        t0 = time.monotonic()
        rest = [a for a in argv[1:] if not a.startswith("--")]
        build(rest[0] if rest else TEST_IMAGE, context="head" if "--head" in argv else None)
        log(f"built in {time.monotonic() - t0:.0f} s")
    elif what == "gpu":
        return build_gpu(keep="--keep" in argv)
    elif what == "clean":
        clean(all_="--all" in argv)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
