"""The user's own code in the model folder, prepared by the launcher before the engine starts.

- `requirements.txt` is installed with pip into the cache folder (never into the image's own
  site-packages) and that folder is put on the engine's path. pip reads its index and wheel folders
  from its usual environment (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX);
  a `requirements/` folder beside the file is a wheel folder too (the layout of AWS's vLLM image),
  so an endpoint without network installs from the model itself. The setting
  install_requirements=false turns it off.
- `model.py` (CUSTOM_SCRIPT_FILENAME) and each `adapters/<name>/model.py` are imported once here,
  the way model-hosting-container-standards (mhcs) loads them in the engine, so a file that does not
  import stops the start with one line naming the file, the line and the error, instead of a
  traceback deep in the engine.

Each failure is a CustomCodeError: one line, exit code 2.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

log = logging.getLogger("serving")

REQUIREMENTS_FILE = "requirements.txt"
WHEEL_FOLDER = "requirements"           # wheels beside requirements.txt (AWS's vLLM image's layout)
DEFAULT_SCRIPT = "model.py"             # mhcs's default CUSTOM_SCRIPT_FILENAME
MODEL_PATH_ENV = "SAGEMAKER_MODEL_PATH"  # where mhcs looks for the script in the engine
# LMI's layout: LoRA adapters in <model>/adapters/<name>/ (adapter_config.json + weights, and optionally
# the adapter's own model.py), also when the model comes from S3 (they are downloaded with it).
ADAPTERS_FOLDER = "adapters"
COMPAT_DIR = Path(__file__).resolve().parent / "djl_compat"  # LMI's djl_python formatter names
PIP_TIMEOUT_S = 1800


class CustomCodeError(Exception):
    """The user's code cannot be used; str() is one line."""


@dataclass
class CustomCode:
    """What the launcher found and prepared in the code folder."""
    folder: Path
    scripts: list[Path] = field(default_factory=list)
    found: list[str] = field(default_factory=list)   # one description per thing found, for the log
    requirements_dir: Path | None = None               # installed requirements (on the engine's path)
    installed: list[str] = field(default_factory=list)

    def python_path(self) -> list[str]:
        """Entries the engine's Python path needs, strongest first."""
        paths = [str(COMPAT_DIR)]
        if self.requirements_dir is not None:
            paths.append(str(self.requirements_dir))
        if self.scripts:
            paths.append(str(self.folder))  # model.py may import its siblings, as in LMI
        return paths


def adapter_scripts(folder: Path) -> list[Path]:
    """model.py of each adapter in the folder's adapters/, by adapter name."""
    return sorted(p for p in (folder / ADAPTERS_FOLDER).glob(f"*/{DEFAULT_SCRIPT}") if p.is_file())


def scripts_in(folder: Path, script: str = DEFAULT_SCRIPT) -> list[Path]:
    """The script (model.py, or CUSTOM_SCRIPT_FILENAME) of the folder and model.py of each adapter."""
    main = folder / script
    return ([main] if main.is_file() else []) + adapter_scripts(folder)


def one_line(e: BaseException) -> str:
    """An exception as `Type: first line of its message` (the type alone when it has no message)."""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# -- requirements.txt --------------------------------------------------------------------------

def install_requirements(folder: Path, cache_dir: Path, env: Mapping[str, str],
                         python: str = sys.executable) -> tuple[Path, list[str]] | None:
    """Install folder/requirements.txt into a folder of the cache; (folder, "name version" list),
    or None when there is no requirements.txt. The folder is named by the file's content, the wheel
    folder's listing and the Python, so an unchanged model installs once per cache."""
    req = folder / REQUIREMENTS_FILE
    if not req.is_file():
        return None
    wheels = folder / WHEEL_FOLDER
    key = hashlib.sha256()
    key.update(req.read_bytes())
    key.update(sys.version.encode())
    if wheels.is_dir():
        for w in sorted(wheels.iterdir()):
            key.update(w.name.encode())
    target = cache_dir / "requirements" / key.hexdigest()[:16]
    done = target / ".installed"
    if done.is_file():  # installed by an earlier start from the same file
        return target, [n for n in done.read_text().split("\n") if n]
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cmd = [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-warn-script-location",
           "--target", str(staging), "-r", str(req)]
    if wheels.is_dir():
        cmd += ["--find-links", str(wheels)]
    log.info("requirements.txt: installing with pip into %s", target)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(env), timeout=PIP_TIMEOUT_S, cwd=folder)
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        raise CustomCodeError(f"requirements.txt: {req}: pip did not finish within {PIP_TIMEOUT_S} s") from None
    if r.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise CustomCodeError(f"requirements.txt: {req}: {pip_failure(r.stdout + r.stderr)}")
    names = installed_in(staging)
    (staging / ".installed").write_text("\n".join(names))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target, names


# pip's own words for a failure -> one line naming the requirement
_PIP_FAILURES = (
    (re.compile(r"No matching distribution found for (\S+)"), "no matching distribution found for {0} "
     "(check the name and version, and the index: PIP_INDEX_URL, or wheels in PIP_FIND_LINKS or requirements/)"),
    (re.compile(r"Invalid requirement: '?([^'\n]+)'?"), "invalid requirement {0!r}"),
    (re.compile(r"Cannot install (.+?) because these package versions have conflicting dependencies"),
     "the requirements conflict: {0}"),
    (re.compile(r"Failed to build (\S+)"), "building {0} failed"),
    (re.compile(r"Could not open requirements file: (.+)"), "{0}"),
)


def pip_failure(output: str) -> str:
    """The reason pip gives, in one line, naming the requirement where pip does."""
    for pattern, text in _PIP_FAILURES:
        m = pattern.search(output)
        if m:
            name = next((g for g in m.groups() if g), "a requirement")
            return "pip: " + text.format(name.rstrip("."))
    last = next((l.strip() for l in reversed(output.splitlines()) if l.strip().startswith("ERROR")), "")
    return "pip failed" + (f": {last}" if last else "")


def installed_in(target: Path) -> list[str]:
    """'name version' of each distribution pip put into target."""
    out = []
    for d in sorted(target.glob("*.dist-info")):
        name, _, version = d.name[:-len(".dist-info")].partition("-")
        out.append(f"{name} {version}")
    return out


# -- model.py -----------------------------------------------------------------------------------

def check_script(path: Path) -> list[str]:
    """Import one script as mhcs does (its function loader) and say what it holds; CustomCodeError
    naming the file, the line and the error when it does not import."""
    root = logging.getLogger()
    levels = [(root, root.level)] + [(h, h.level) for h in root.handlers]
    try:
        # importing mhcs sets the root logger's level (SAGEMAKER_CONTAINER_LOG_LEVEL, default ERROR)
        from model_hosting_container_standards.common.custom_code_ref_resolver.function_loader import (
            FunctionLoader)
        try:
            module = FunctionLoader([str(path.parent)]).load_module_from_file(str(path))
        except Exception as e:  # the user's code may raise anything at import
            raise CustomCodeError(script_failure(path, e)) from None
    finally:
        for obj, level in levels:
            obj.setLevel(level)
    return describe(path, module)


def script_failure(path: Path, e: BaseException) -> str:
    line = None
    where = str(path.resolve())
    for frame in traceback.extract_tb(e.__traceback__):
        if str(Path(frame.filename).resolve()) == where:
            line = frame.lineno  # the last frame in the script: the statement that failed
    if isinstance(e, SyntaxError) and e.filename and Path(e.filename).resolve() == path.resolve():
        line = e.lineno
    at = f" line {line}" if line else ""
    hint = ""
    if isinstance(e, ModuleNotFoundError):
        what = f"missing module {e.name!r}"
        hint = f"; add the package that provides it to {REQUIREMENTS_FILE} beside the script"
    else:
        what = one_line(e)
    return f"custom code: {path}{at} does not import: {what}{hint}"


_MHCS_NAMES = ("custom_sagemaker_ping_handler", "custom_sagemaker_invocation_handler")


def describe(path: Path, module) -> list[str]:
    out = []
    for name, obj in sorted(vars(module).items()):
        if not callable(obj):
            continue
        if getattr(obj, "is_input_formatter", False) is True:
            out.append(f"LMI input formatter {name}")
        if getattr(obj, "is_output_formatter", False) is True:
            out.append(f"LMI output formatter {name}")
        if name in _MHCS_NAMES:
            out.append(f"SageMaker handler {name}")
    return [f"{path}: " + (", ".join(out) if out else "imported")]


# -- the whole preparation ---------------------------------------------------------------------

def code_folder(configured: Path | None, model_source: str, model_path: str, model_dir: Path) -> Path:
    """Where the user's code lives: the setting custom_code_dir (SAGEMAKER_MODEL_PATH) when set, else
    the model's own folder (local, the model directory, or the s3:// download), else the model directory."""
    if configured is not None:
        return configured
    if model_source in ("local", "model-dir", "s3"):
        return Path(model_path)
    return model_dir


def prepare(folder: Path, script: str, cache_dir: Path, env: Mapping[str, str], install: bool) -> CustomCode:
    code = CustomCode(folder)
    if (folder / REQUIREMENTS_FILE).is_file():
        if install:
            target, names = install_requirements(folder, cache_dir, env)
            code.requirements_dir, code.installed = target, names
        else:
            code.found.append(f"{folder / REQUIREMENTS_FILE}: not installed (install_requirements=false)")
    code.scripts = scripts_in(folder, script)
    if code.scripts:
        added = [p for p in code.python_path() if p not in sys.path]
        sys.path[:0] = added
        try:
            for script in code.scripts:
                code.found += check_script(script)
        finally:
            for p in added:
                sys.path.remove(p)
    return code
