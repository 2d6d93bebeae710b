"""The LMI/TGI request body, validated strictly so a client learns exactly what is wrong.

    {"inputs": "text" | ["text", ...], "parameters": {...}, "stream": false}

Types are strict (no "30" for 30, no true for 1): LMI clients send JSON numbers, and a
silently coerced value would hide a client bug. Parameters LMI/TGI define that the engine
cannot honour (typical_p, watermark, best_of > 1, top_n_tokens) are rejected with the
reason rather than ignored.
"""
from __future__ import annotations

from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from .errors import LMIError

INT64_MAX = 2**63 - 1
LMI_DEFAULT_MAX_NEW_TOKENS = 30  # LMI's documented default


def _allowed(text: str) -> Any:
    return Field(None, description=text)


class LMIParameters(BaseModel):
    """LMI's GenerationParameters. `description` is the 'allowed' text of the error message."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_new_tokens: int | None = Field(None, ge=1, description="an integer >= 1 (default 30)")
    temperature: float | None = Field(None, ge=0, le=2, description="a number in [0, 2] (0 means greedy)")
    top_p: float | None = Field(None, gt=0, le=1, description="a number in (0, 1]")
    # A top_k that does not fit 64 bits fails the request inside the engine (a 500), so it is refused here.
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX,
                              description="an integer from 1 to 2^63-1, or 0 / -1 for no limit")
    do_sample: bool | None = _allowed("true or false (false: greedy decoding)")
    seed: int | None = Field(None, ge=0, le=INT64_MAX, description="an integer from 0 to 2^63-1")
    stop: str | list[str] | None = _allowed("a string or a list of strings")
    stop_sequences: str | list[str] | None = _allowed("a string or a list of strings")
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="a number in (0, 10] (1 = off)")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="a number in [-2, 2]")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="a number in [-2, 2]")
    min_p: float | None = Field(None, ge=0, le=1, description="a number in [0, 1]")
    min_new_tokens: int | None = Field(None, ge=0, description="an integer >= 0")
    return_full_text: bool | None = _allowed("true or false")
    details: bool | None = _allowed("true or false")
    decoder_input_details: bool | None = _allowed("true or false (not with stream=true)")
    truncate: int | None = Field(None, ge=1, description="an integer >= 1 (keep that many last prompt tokens)")
    ignore_eos_token: bool | None = _allowed("true or false")
    # TGI fields the engine has no equivalent for: accepted only at their neutral value.
    best_of: int | None = Field(None, ge=1, le=1, description="1 (vLLM 0.32 has no best_of; send separate requests)")
    typical_p: float | None = Field(None, description="1.0 or null (typical sampling is not supported)")
    watermark: bool | None = Field(None, description="false (text watermarking is not supported)")
    top_n_tokens: int | None = Field(None, ge=0, le=0, description="0 or null (top-n token alternatives are not supported)")


class LMIRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: str | list[str] = Field(description="a non-empty string or a non-empty list of non-empty strings")
    parameters: LMIParameters = Field(default_factory=LMIParameters, description="an object of generation parameters")
    stream: bool = Field(False, description="true or false")
    adapters: str | list[str] | None = Field(None, description="a LoRA adapter's name, or one per input (the same "
                                             "for every input)")

    @property
    def prompts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)


# Names clients bring from other APIs, so the error can say what we call them.
_SPELLINGS = {"max_tokens": "max_new_tokens", "stop_words": "stop", "n": "best_of", "adapter": "adapters",
              "min_tokens": "min_new_tokens", "ignore_eos": "ignore_eos_token"}


NO_KIND = ("body: not a request this endpoint serves; send a JSON object with one of: inputs (LMI/TGI), "
           "prompt (OpenAI completion), messages (OpenAI chat)")


def body_kind(doc: Any) -> str | None:
    """"lmi" for LMI/TGI bodies (`inputs`), "completion" / "chat" for OpenAI bodies (`prompt` /
    `messages`), "session" for SageMaker's session requests (`requestType`, answered by vLLM's
    SageMaker hooks), None for anything else (LMI answers that with 424)."""
    if not isinstance(doc, dict):
        return None
    if "inputs" in doc:
        return "lmi"
    if "requestType" in doc:
        return "session"
    if "messages" in doc:
        return "chat"
    if "prompt" in doc:
        return "completion"
    return None


def parse(doc: dict) -> LMIRequest:
    """Validate an LMI body or raise LMIError naming the first faulty field and what it allows."""
    # null means "not given" for the optional members, as it does for every parameter
    doc = {k: v for k, v in doc.items() if not (v is None and k in ("parameters", "stream"))}
    try:
        req = LMIRequest.model_validate(doc)
    except pydantic.ValidationError as e:
        raise _to_lmi_error(e.errors(include_url=False)) from None
    prompts = req.prompts
    if not prompts:
        raise LMIError("inputs: the list is empty; send at least one prompt", "inputs")
    for i, p in enumerate(prompts):
        if not p:
            where = "inputs" if isinstance(req.inputs, str) else f"inputs[{i}]"
            raise LMIError(f"{where}: empty prompt; send non-empty text", where)
    p = req.parameters
    if p.typical_p is not None and p.typical_p != 1.0:
        raise LMIError(f"parameters.typical_p: {p.typical_p} is not supported; allowed: "
                       + _describe(LMIParameters, "typical_p"), "parameters.typical_p")
    if p.watermark:
        raise LMIError("parameters.watermark: true is not supported; allowed: "
                       + _describe(LMIParameters, "watermark"), "parameters.watermark")
    if isinstance(req.adapters, list) and (len(req.adapters) != len(prompts) or len(set(req.adapters)) != 1):
        raise LMIError(f"adapters: give one adapter name, or one per input ({len(prompts)}) all the same; "
                       "send inputs for different adapters as separate requests", "adapters")
    if req.stream and p.decoder_input_details:
        raise LMIError("parameters.decoder_input_details: not available with stream=true", 
                       "parameters.decoder_input_details")
    for name in ("stop", "stop_sequences"):
        for s in _as_list(getattr(p, name)):
            if not s:
                raise LMIError(f"parameters.{name}: empty stop string; allowed: non-empty strings",
                               f"parameters.{name}")
    return req


def _as_list(v: str | list[str] | None) -> list[str]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else v


def stop_strings(p: LMIParameters) -> list[str]:
    """`stop` (LMI) and `stop_sequences` (TGI) together, first occurrence kept."""
    return list(dict.fromkeys([*_as_list(p.stop), *_as_list(p.stop_sequences)]))


def _describe(model: type[BaseModel], name: str) -> str:
    f = model.model_fields.get(name)
    return (f.description if f and f.description else "see the LMI documentation")


def _to_lmi_error(errors: list[dict]) -> LMIError:
    # For a union (str | list[str]) pydantic reports each branch; the deepest error points
    # at the actual culprit (e.g. the one non-string item of a list).
    def field_of(err):
        loc = [x for x in err["loc"] if not _is_type_name(x)]
        return loc[:2] if loc[:1] == ["parameters"] else loc[:1]
    same = [e for e in errors if field_of(e) == field_of(errors[0])]
    e = max(same, key=lambda err: len(err["loc"]))
    loc = [x for x in e["loc"] if not _is_type_name(x)]
    if loc and loc[0] == "parameters" and len(loc) > 1 and isinstance(loc[1], str):
        model, name, rest = LMIParameters, loc[1], loc[2:]
        field = f"parameters.{name}"
    else:
        model, name, rest = LMIRequest, str(loc[0]) if loc else "body", loc[1:]
        field = name
    field += "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in rest)
    if e["type"] == "extra_forbidden":
        allowed = ", ".join(model.model_fields)
        hint = f" (did you mean {_SPELLINGS[name]}?)" if name in _SPELLINGS else ""
        return LMIError(f"{field}: unknown field{hint}; allowed: {allowed}", field)
    if e["type"] == "missing":
        return LMIError(f"{field}: required; send {_describe(model, name)}", field)
    if e["type"] == "model_type":
        return LMIError(f"{field}: must be {_describe(model, name)}", field)
    got = e.get("input")
    shown = repr(got) if isinstance(got, (int, float, bool, type(None))) else type(got).__name__
    return LMIError(f"{field}: {e['msg'].rstrip('.')} (got {shown}); allowed: {_describe(model, name)}", field)


def _is_type_name(x) -> bool:
    # pydantic puts the union member tried ("str", "list[str]", "int") into `loc`
    return isinstance(x, str) and (x in ("str", "int", "float", "bool") or x.startswith("list["))
