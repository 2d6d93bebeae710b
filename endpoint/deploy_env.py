"""A deployment's container environment, named by the settings table (serving/settings.py).

`option.<key>` lines of a serving.properties file and `-o key=value` flags become the
environment variable the container reads first for that setting: OPTION_<KEY> of the
canonical key (aliases and vLLM flag names map to it). Values of declared settings are
parsed here with the table's own parsers, so a typo fails before a 30-minute endpoint
start instead of after it; other keys go to vLLM and are checked with its parser where
vLLM is installed. Secrets never come from argv and are masked wherever they are shown.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from serving.resolve import ConfigError, read_properties
from serving.settings import BY_ENV, BY_FLAG, BY_KEY, Setting, SettingValueError, looks_secret, to_environment

# Settings the container must not take from a deployment: SageMaker sends traffic to 0.0.0.0:8080.
NOT_DEPLOYABLE = {"port": "SageMaker sends requests to port 8080", "host": "SageMaker needs 0.0.0.0"}
MASK = "****"


def setting_for(key: str) -> Setting | None:
    """The declared setting of an option key: its canonical key, an alias, or its vLLM flag's name."""
    return BY_KEY.get(key) or BY_FLAG.get("--" + key.replace("_", "-"))


def env_name(key: str) -> str:
    """The environment name the container reads first for an option key."""
    s = setting_for(key)
    (name,) = to_environment({s.key if s else key: ""})
    return name


@dataclass
class Environment:
    values: dict[str, str] = field(default_factory=dict)
    secret: set[str] = field(default_factory=set)  # names whose values are never printed
    sources: dict[str, str] = field(default_factory=dict)
    passthrough: dict[str, str] = field(default_factory=dict)  # env name -> key not in the table (a vLLM argument)

    def set(self, key: str, raw: str, source: str, secret_ok: bool) -> None:
        key = key.strip().replace("-", "_")
        s = setting_for(key)
        if key in NOT_DEPLOYABLE or (s and s.key in NOT_DEPLOYABLE):
            raise ConfigError(key, source, f"cannot be set on an endpoint ({NOT_DEPLOYABLE[s.key if s else key]})")
        if s is not None:
            try:
                s.parse(raw)
            except SettingValueError as e:
                raise ConfigError(key, source, str(e)) from None
        secret = bool(s and s.secret) or looks_secret(key)
        if secret and not secret_ok:
            hint = next((e for e in reversed(s.env_names) if not e.startswith("OPTION_")), None) if s else None
            raise ConfigError(key, source, "is a secret: a value on the command line shows in ps and shell history; "
                              f"export it and pass --secret-env {hint or env_name(key)}, or write it in the "
                              "properties file")
        name = env_name(key)
        self.values[name] = raw.strip()
        self.sources[name] = source
        if secret:
            self.secret.add(name)
        if s is None:
            self.passthrough[name] = key
        else:
            self.passthrough.pop(name, None)

    def check_passthrough(self) -> list[str]:
        """Check keys that are not container settings against vLLM's own parser, where vLLM is installed
        (as the container does at start); returns notes for what could not be checked here."""
        import importlib.util

        if not self.passthrough:
            return []
        if importlib.util.find_spec("vllm") is None:
            return [f"{name}: not a container setting; passed to vLLM as --{key.replace('_', '-')} and checked by "
                    "the container at start (vLLM is not installed here)" for name, key in self.passthrough.items()]
        import difflib

        from serving.vllm_args import VllmArgs

        vllm = VllmArgs()
        for name, key in self.passthrough.items():
            flag = vllm.flag_for(key)
            if flag is None:
                known = sorted(set(BY_KEY) | set(vllm.keys()))
                raise ConfigError(key, self.sources[name], "unknown setting: not a container setting nor an argument "
                                  "of vLLM's OpenAI server", difflib.get_close_matches(key, known, n=3, cutoff=0.6))
            try:
                vllm.argv(flag, self.values[name])
            except SettingValueError as e:
                raise ConfigError(key, self.sources[name], str(e)) from None
        return []

    def masked(self) -> dict[str, str]:
        return {k: MASK if k in self.secret else v for k, v in self.values.items()}


def build_environment(properties: str | None, options: list[str], secret_envs: list[str],
                      local_env=os.environ) -> Environment:
    """The model's Environment: the properties file, then -o flags, then --secret-env names (later wins)."""
    env = Environment()
    if properties:
        path = Path(properties)
        if not path.is_file():
            raise ConfigError("--properties", properties, "no such file")
        for key, raw, src in read_properties(path):
            env.set(key, raw, src, secret_ok=True)
    for opt in options:
        key, sep, raw = opt.partition("=")
        if not sep or not key.strip():
            raise ConfigError(opt, "-o", "expected key=value (an option key of serving.properties, e.g. "
                              "-o max_model_len=32768)")
        env.set(key, raw, f"-o {key.strip()}", secret_ok=False)
    for name in secret_envs:
        s = BY_ENV.get(name)
        key = s.key if s else (name[len("OPTION_"):].lower() if name.startswith("OPTION_") else None)
        if key is None or not (s and s.secret or looks_secret(key)):
            raise ConfigError(name, "--secret-env", "not the environment name of a secret setting (e.g. HF_TOKEN)")
        if not local_env.get(name):
            raise ConfigError(name, "--secret-env", f"{name} is not set in this shell's environment")
        env.set(key, local_env[name], f"env {name}", secret_ok=True)
    return env
