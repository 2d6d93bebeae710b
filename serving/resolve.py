"""Resolve the effective settings from defaults, serving.properties and the environment.

Sources, weakest first (`settings.Level`): the table's defaults, context defaults (those that
depend on the build or the model, decided by the launcher), `serving.properties` in the model
directory, the environment. Which candidate wins is `settings.rank`, nothing else. Every time a
stronger source overrides a weaker one the result records it, so the startup log can say which won.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping

from .settings import (BY_ENV, BY_FLAG, BY_KEY, TABLE, Context, Level, Setting, Settings, SettingValueError,
                       looks_secret, rank)

PROPERTIES_FILE = "serving.properties"
# Top-level (non-option) serving.properties keys LMI users write; read as the option of the same name.
TOP_LEVEL_KEYS = frozenset(k for s in TABLE.values() if s.top_level for k in s.option_keys)
# LMI writes its model-server settings as SERVING_<KEY>; those the table does not declare have no effect here.
LMI_SERVER_PREFIX = "SERVING_"


class ConfigError(Exception):
    """A setting that stops the start. str() is one line naming the key, the source and what is allowed."""

    def __init__(self, key: str, source: str, message: str, suggestions: list[str] | None = None):
        self.key, self.source, self.message, self.suggestions = key, source, message, suggestions or []
        hint = f" (did you mean: {', '.join(self.suggestions)}?)" if self.suggestions else ""
        super().__init__(f"{key} from {source}: {message}{hint}")


@dataclass(frozen=True)
class Candidate:
    raw: str
    source: str  # human-readable, e.g. "env OPTION_MAX_MODEL_LEN"
    rank: tuple[int, int, int]  # settings.rank: higher wins


@dataclass(frozen=True)
class ContextDefault:
    """A default that depends on the build or the model; beats the table's default, loses to the user."""
    key: str
    raw: str
    why: str  # e.g. "CPU build": the source reads "default (CPU build)"


@dataclass(frozen=True)
class Resolved:
    """One effective setting: declared (setting is not None) or a vLLM pass-through (flag is set)."""

    key: str
    raw: str
    value: object
    source: str
    setting: Setting | None = None
    flag: str | None = None
    overridden: tuple[Candidate, ...] = ()

    @property
    def secret(self) -> bool:
        return bool(self.setting and self.setting.secret) or looks_secret(self.key)

    def shown(self) -> str:
        return "****" if self.secret else str(self.value)


@dataclass(frozen=True)
class Resolution:
    settings: Settings                 # typed values of the declared settings
    entries: Mapping[str, Resolved]    # every effective setting (declared and pass-through), with its source
    notes: tuple[str, ...] = ()        # one line for each name accepted that has no effect here


def location(key: str, env: Mapping[str, str] = os.environ) -> Path:
    """A location setting (model_dir, cache_dir, ...), read before anything else: environment or default."""
    s = TABLE[key]
    set_names = [n for n in s.env_names if env.get(n, "").strip()]
    return s.parse(env[set_names[0]]) if set_names else s.default


def model_dir(env: Mapping[str, str] = os.environ) -> Path:
    return location("model_dir", env)


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The project's cache: the embedded tiny model, s3:// downloads, the tests' pinned wheels."""
    return location("cache_dir", env)


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


def env_candidates(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(key, raw, environment name) from the environment; key is a declared key or a pass-through name."""
    out = []
    for name, raw in env.items():
        if name in BY_ENV:
            s = BY_ENV[name]
            if s.location and not raw.strip():
                continue  # an empty location is unset
            out.append((s.key, raw, name))
        elif name.startswith("OPTION_") and len(name) > len("OPTION_"):
            out.append((name[len("OPTION_"):].lower(), raw, name))
        elif name.startswith("SM_VLLM_") and len(name) > len("SM_VLLM_"):
            out.append((name[len("SM_VLLM_"):].lower(), raw, name))
    return out


def unknown_server_names(env: Mapping[str, str]) -> list[str]:
    """SERVING_<KEY> names the table does not declare: LMI model-server settings this container lacks."""
    return sorted(n for n in env if n.startswith(LMI_SERVER_PREFIX) and n not in BY_ENV)


class Sources:
    """Every candidate value from the table's defaults, serving.properties and the environment."""

    def __init__(self, env: Mapping[str, str] | None = None, vllm_args=None):
        env = dict(os.environ if env is None else env)
        self.vllm_args = vllm_args
        self.cands: dict[str, list[Candidate]] = {}
        for s in SETTINGS_WITH_DEFAULTS:
            self.cands[s.key] = [Candidate(str(s.default), "default", rank(Level.DEFAULT, s, s.key))]
        for key, raw, src in read_properties(model_dir(env) / PROPERTIES_FILE):
            self._add(Level.FILE, key, key, raw, src)
        for key, raw, name in env_candidates(env):
            self._add(Level.ENV, key, name, raw, f"env {name}")
        self.notes = [f"env {n}: no effect here (an LMI model-server setting this container does not have)"
                      for n in unknown_server_names(env)]

    def _setting(self, key: str) -> Setting | None:
        s = BY_KEY.get(key)
        if s is None and self.vllm_args is not None:
            # A vLLM name of a declared setting (option.model, OPTION_TENSOR_PARALLEL_SIZE, ...).
            s = BY_FLAG.get(self.vllm_args.flag_for(key) or "")
        return s

    def _add(self, level: Level, key: str, name: str, raw: str, source: str) -> None:
        key = key.replace("-", "_")
        s = TABLE.get(key) if level is Level.ENV and name in BY_ENV else self._setting(key)
        if s is None and key in TABLE and TABLE[key].location:
            names = ", ".join(TABLE[key].env_names)
            raise ConfigError(key, source, f"a location is set in the environment only ({names})")
        if s is not None:
            key = s.key
        self.cands.setdefault(key, []).append(Candidate(raw, source, rank(level, s, name)))

    def resolve(self, ctx: Context = Context(), defaults: Iterable[ContextDefault] = ()) -> Resolution:
        cands = {k: list(v) for k, v in self.cands.items()}
        for d in defaults:
            s = TABLE.get(d.key)
            cands.setdefault(d.key, []).append(
                Candidate(d.raw, f"default ({d.why})", rank(Level.CONTEXT, s, d.key)))
        entries: dict[str, Resolved] = {}
        for key, cs in cands.items():
            cs.sort(key=lambda c: c.rank, reverse=True)
            # A context default only fills a gap: when the user set the key it is not reported as overridden.
            losers = tuple(c for c in cs[1:] if c.rank[0] != Level.CONTEXT)
            entries[key] = self._pick(key, cs[0], losers, ctx)
        values = {k: r.value for k, r in entries.items() if k in TABLE}
        notes = [f"{r.key}={r.shown()} from {r.source}: no effect here: {r.setting.no_effect}"
                 for r in entries.values() if r.setting is not None and r.setting.no_effect]
        return Resolution(Settings(**values), MappingProxyType(entries), tuple(notes + self.notes))

    def resolve_one(self, key: str, ctx: Context = Context()) -> Resolved | None:
        """One declared setting on its own (no vLLM arguments needed), or None when nothing sets it."""
        cs = sorted(self.cands.get(key, ()), key=lambda c: c.rank, reverse=True)
        return self._pick(key, cs[0], tuple(cs[1:]), ctx) if cs else None

    def _pick(self, key: str, win: Candidate, losers: tuple[Candidate, ...], ctx: Context) -> Resolved:
        setting = TABLE.get(key)
        if setting is not None:
            try:
                value = setting.parse(win.raw)
                if setting.contextual is not None:
                    value = setting.contextual(value, ctx)
            except SettingValueError as e:
                raise ConfigError(key, win.source, str(e)) from None
            if setting.choices and str(value).lower() not in setting.choices:
                raise ConfigError(key, win.source, f"{value!r} is not supported here; allowed: "
                                  f"{', '.join(setting.choices)} ({setting.instead})")
            return Resolved(key, win.raw, value, win.source, setting=setting, flag=setting.flag, overridden=losers)
        if self.vllm_args is None:
            raise ConfigError(key, win.source, "not a declared setting (vLLM arguments were not loaded)")
        flag = self.vllm_args.flag_for(key)
        if flag is None:
            known = sorted(set(BY_KEY) | set(self.vllm_args.keys()))
            raise ConfigError(key, win.source, "unknown setting: not a container setting nor an argument of "
                              "vLLM's OpenAI server", difflib.get_close_matches(key, known, n=3, cutoff=0.6))
        return Resolved(key, win.raw, win.raw, win.source, flag=flag, overridden=losers)


# Locations are read on their own (model_dir, before the file it holds); their defaults are not reported.
SETTINGS_WITH_DEFAULTS = tuple(s for s in TABLE.values() if s.default is not None and not s.location)


def resolve(env: Mapping[str, str] | None = None, vllm_args=None, ctx: Context = Context(),
            defaults: Iterable[ContextDefault] = ()) -> Resolution:
    """All effective settings. `vllm_args` (VllmArgs) types pass-through keys; without it only
    declared settings resolve."""
    return Sources(env, vllm_args).resolve(ctx, defaults)
