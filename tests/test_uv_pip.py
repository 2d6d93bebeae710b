"""tools/uv_pip.py: the project's venv installed by uv from the indexes, folders, constraints and CA bundle this
machine's pip is configured with (pip's files and PIP_* variables, the variables winning), or by pip where pip is
configured with something it does not pass on."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools import uv_pip
from user_code import WHEEL_NAME, WHEEL_VERSION, make_wheel

ROOT = Path(__file__).resolve().parents[1]
UV = str(Path(sys.executable).parent / "uv")  # make venv installs it beside the venv's Python

LISTING = """global.cert='/etc/ssl/certs/ca.crt'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/opt/wheels'
global.constraint='/etc/pip/constraints.txt'
install.find-links='/opt/install-wheels'
:env:.find-links='/opt/env-wheels'
:env:.default-timeout='180'
:env:.trusted-host='mirror.internal'
"""


def test_each_setting_is_pips_effective_one_the_environment_winning():
    s = uv_pip.pip_settings(LISTING)
    assert s["find-links"] == "/opt/env-wheels"  # files < the install section < PIP_FIND_LINKS, as pip reads them
    assert s["extra-index-url"] == "file:///opt/a/simple file:///opt/b/simple"
    assert s["cert"] == "/etc/ssl/certs/ca.crt" and s["default-timeout"] == "180"


def test_each_setting_becomes_uvs_flag_and_uv_takes_the_best_match_across_them():
    cmd, env = uv_pip.uv_command("uv", uv_pip.pip_settings(LISTING), ["-q", "-r", "x.txt"])
    assert cmd[:5] == ["uv", "pip", "install", "--python", sys.executable] and cmd[-3:] == ["-q", "-r", "x.txt"]
    assert "--compile-bytecode" in cmd  # the .pyc files pip writes (where PYTHONDONTWRITEBYTECODE is set, none else)
    flags = [a for a in cmd[5:-3] if a != "--compile-bytecode"]
    pairs = list(zip(flags[::2], flags[1::2]))
    assert ("--index-strategy", "unsafe-best-match") in pairs
    assert {("--extra-index-url", "file:///opt/a/simple"), ("--extra-index-url", "file:///opt/b/simple")} <= set(pairs)
    assert ("--find-links", "/opt/env-wheels") in pairs and ("--find-links", "/opt/wheels") not in pairs
    assert {("--constraints", "/etc/pip/constraints.txt"), ("--allow-insecure-host", "mirror.internal")} <= set(pairs)
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt", "UV_HTTP_TIMEOUT": "180"}
    no_index, _ = uv_pip.uv_command("uv", {"no-index": "true"}, [])
    assert "--no-index" in no_index


def test_a_setting_uv_is_not_given_leaves_the_install_to_pip():
    assert uv_pip.uv_command("uv", uv_pip.pip_settings(LISTING + "global.pre='true'\n"), []) == "pre"
    assert uv_pip.uv_command("uv", uv_pip.pip_settings(":env:.only-binary=':all:'\n"), []) == "only-binary"


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def _install(python: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(ROOT / "tools" / "uv_pip.py"), UV, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_uv_installs_from_the_folder_pip_is_configured_with(tmp_path):
    """A real install: uv finds the package only in the find-links folder that PIP_FIND_LINKS names (no index,
    pip's configuration files left out), and the venv's Python then finds it, installed by uv (its INSTALLER
    record). With a setting uv is not given (PIP_PRE), pip installs it, saying which setting made it."""
    make_wheel(tmp_path / "wheels")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(tmp_path / "wheels"), PIP_NO_INDEX="1")
    dist = WHEEL_NAME.replace("_", "-")
    for installer, extra in (("uv", {}), ("pip", {"PIP_PRE": "1"})):
        python = _venv(tmp_path / installer)
        r = _install(python, {**env, **extra}, f"{dist}=={WHEEL_VERSION}")
        assert r.returncode == 0, r.stderr
        assert ("pip's configuration sets pre" in r.stderr) == (installer == "pip"), r.stderr
        got = subprocess.run([str(python), "-c", f"import importlib.util as u, importlib.metadata as m; "
                              f"assert u.find_spec('{WHEEL_NAME}'); d = m.distribution('{dist}'); "
                              f"print(d.version, d.read_text('INSTALLER').strip())"],
                             capture_output=True, text=True, timeout=60)
        assert got.stdout.split() == [WHEEL_VERSION, installer], (installer, got.stderr)
    missing = _install(tmp_path / "uv" / "bin" / "python", env, f"{dist}==9.9.9")  # a version the folder lacks
    assert missing.returncode != 0 and f"{dist}==9.9.9" in missing.stderr
