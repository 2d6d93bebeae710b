"""Resolve the effective settings from defaults, serving.properties and the environment.

Sources, weakest first: the table's defaults, `serving.properties` in the model
directory, the environment. Among environment names of one setting the
strongest is OPTION_<KEY>, then SM_VLLM_<FLAG>, then the TGI/HF names (see
`Setting.env_names`). Every time a stronger source overrides a weaker one the
result records it, so the startup log can say which won.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .settings import BY_ENV, BY_FLAG, BY_KEY, Setting, SettingValueError, looks_secret

DEFAULT_MODEL_DIR = "/opt/ml/model"
PROPERTIES_FILE = "serving.properties"
# Top-level (non-option) serving.properties keys LMI users write; read as the option of the same name.
TOP_LEVEL_KEYS = ("engine",)
# LMI keys that ask for this container's own behaviour: the values it can honour.
ALLOWED = {"rolling_batch": ("vllm", "auto"), "engine": ("python",)}


class ConfigError(Exception):
    """A setting that stops the start. str() is one line naming the key, the source and what is allowed."""

    def __init__(self, key: str, source: str, message: str, suggestions: list[str] | None = None):
        self.key, self.source, self.message, self.suggestions = key, source, message, suggestions or []
        hint = f" (did you mean: {', '.join(self.suggestions)}?)" if self.suggestions else ""
        super().__init__(f"{key} from {source}: {message}{hint}")


@dataclass
class Candidate:
    raw: str
    source: str  # human-readable, e.g. "env OPTION_MAX_MODEL_LEN"
    rank: tuple[int, int]  # (level, strength within level): higher wins


@dataclass
class Resolved:
    """One effective setting: declared (setting is not None) or a vLLM pass-through (flag is set)."""

    key: str
    raw: str
    value: object
    source: str
    setting: Setting | None = None
    flag: str | None = None
    overridden: list[Candidate] = field(default_factory=list)

    @property
    def secret(self) -> bool:
        return bool(self.setting and self.setting.secret) or looks_secret(self.key)

    def shown(self) -> str:
        return "****" if self.secret else str(self.value)


LEVEL_DEFAULT, LEVEL_FILE, LEVEL_ENV = 0, 1, 2


def model_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("SERVING_MODEL_DIR") or DEFAULT_MODEL_DIR)


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The project's cache: the embedded tiny model, s3:// downloads, the tests' pinned wheels."""
    return Path(env.get("LMI_CACHE_DIR") or Path.home() / ".cache" / "lmi-fp8")


def read_properties(path: Path) -> list[tuple[str, str, str]]:
    """serving.properties lines as (option key, raw value, source). Raises ConfigError on a bad line."""
    out = []
    if not path.is_file():
        return out
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(("#", "!")):
            continue
        sep = min((i for i in (s.find("="), s.find(":")) if i > 0), default=-1)
        if sep < 0:
            raise ConfigError(f"line {n}", f"{path}:{n}", f"expected key=value, got {s!r}")
        key, raw = s[:sep].strip(), s[sep + 1:].strip()
        src = f"{path}:{n}"
        if key.startswith("option."):
            out.append((key[len("option."):], raw, src))
        elif key in TOP_LEVEL_KEYS:
            out.append((key, raw, src))
        else:
            raise ConfigError(key, src, "unknown top-level key; engine settings are written option.<key>=<value>",
                              suggestions=[f"option.{key}"])
    return out


def env_candidates(env: Mapping[str, str]) -> list[tuple[str, str, str, int]]:
    """(key, raw, source, strength) from the environment; key is a declared key or a pass-through name."""
    out = []
    for name, raw in env.items():
        if name in BY_ENV:
            s = BY_ENV[name]
            strength = len(s.env_names) - s.env_names.index(name)
            out.append((s.key, raw, f"env {name}", strength))
        elif name.startswith("OPTION_") and len(name) > len("OPTION_"):
            out.append((name[len("OPTION_"):].lower(), raw, f"env {name}", 2))
        elif name.startswith("SM_VLLM_") and len(name) > len("SM_VLLM_"):
            out.append((name[len("SM_VLLM_"):].lower(), raw, f"env {name}", 1))
    return out


def resolve(env: Mapping[str, str] | None = None, vllm_args=None) -> dict[str, Resolved]:
    """All effective settings, keyed by canonical key. `vllm_args` types pass-through keys (VllmArgs)."""
    env = dict(os.environ if env is None else env)
    cands: dict[str, list[Candidate]] = {}

    def add(key: str, raw: str, source: str, rank: tuple[int, int]) -> None:
        key = key.replace("-", "_")
        s = BY_KEY.get(key)
        if s is None and vllm_args is not None:
            # A vLLM name of a declared setting (option.model, OPTION_TENSOR_PARALLEL_SIZE, ...).
            s = BY_FLAG.get(vllm_args.flag_for(key) or "")
        if s is not None:
            # Within one level an exact canonical key beats an alias.
            rank = (rank[0], rank[1] * 10 + (1 if key == s.key else 0))
            key = s.key
        cands.setdefault(key, []).append(Candidate(raw, source, rank))

    for s in BY_KEY.values():
        if s.default is not None and s.key not in cands:
            cands[s.key] = [Candidate(str(s.default), "default", (LEVEL_DEFAULT, 0))]
    for key, raw, src in read_properties(model_dir(env) / PROPERTIES_FILE):
        add(key, raw, src, (LEVEL_FILE, 1))
    for key, raw, src, strength in env_candidates(env):
        add(key, raw, src, (LEVEL_ENV, strength))

    out: dict[str, Resolved] = {}
    for key, cs in cands.items():
        cs.sort(key=lambda c: c.rank, reverse=True)
        win, losers = cs[0], cs[1:]
        setting = BY_KEY.get(key)
        if setting is not None:
            try:
                value = setting.parse(win.raw)
            except SettingValueError as e:
                raise ConfigError(key, win.source, str(e)) from None
            if key in ALLOWED and str(value).lower() not in ALLOWED[key]:
                raise ConfigError(key, win.source, f"{value!r} is not supported here; allowed: "
                                  f"{', '.join(ALLOWED[key])} (this container always runs vLLM)")
            out[key] = Resolved(key, win.raw, value, win.source, setting=setting, flag=setting.flag,
                                overridden=losers)
            continue
        if vllm_args is None:
            raise ConfigError(key, win.source, "not a declared setting (vLLM arguments were not loaded)")
        flag = vllm_args.flag_for(key)
        if flag is None:
            known = sorted(set(BY_KEY) | set(vllm_args.keys()))
            raise ConfigError(key, win.source, "unknown setting: not a container setting nor an argument of "
                              "vLLM's OpenAI server", difflib.get_close_matches(key, known, n=3, cutoff=0.6))
        out[key] = Resolved(key, win.raw, win.raw, win.source, flag=flag, overridden=losers)
    return out

