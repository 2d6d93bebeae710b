"""LMI body -> vLLM completion request, and vLLM's answer -> LMI's answer.

The LMI request becomes one OpenAI completion request (a list input becomes vLLM's list
prompt, one choice per input) that vLLM's own completion handler serves, so prompt
rendering, limits and sampling follow exactly the same code as /v1/completions.
"""
from __future__ import annotations

import logging
import re
from typing import Any

from .errors import LMIError
from .schema import LMI_DEFAULT_MAX_NEW_TOKENS, LMIRequest, stop_strings

log = logging.getLogger("vllm.lmi")

# vLLM's names -> the LMI field the client sent, for error messages.
_FIELD_FOR_PARAM = {
    "max_tokens": "parameters.max_new_tokens", "prompt": "inputs", "input_tokens": "inputs", "model": "adapters",
    "truncate_prompt_tokens": "parameters.truncate", "temperature": "parameters.temperature",
    "top_p": "parameters.top_p", "top_k": "parameters.top_k", "seed": "parameters.seed",
    "stop": "parameters.stop", "repetition_penalty": "parameters.repetition_penalty",
    "min_tokens": "parameters.min_new_tokens", "min_p": "parameters.min_p",
    "frequency_penalty": "parameters.frequency_penalty", "presence_penalty": "parameters.presence_penalty",
}
_RENAMES = [(re.compile(r"\bmax_tokens\b"), "max_new_tokens"), (re.compile(r"\bmin_tokens\b"), "min_new_tokens"),
            (re.compile(r"\btruncate_prompt_tokens\b"), "truncate")]


def sampling_is_requested(req: LMIRequest) -> bool:
    """LMI's do_sample defaults to false (greedy); TGI turns sampling on when a sampling knob is set.

    We follow TGI when do_sample is absent so a client's temperature/top_p/top_k is never
    silently ignored; an explicit do_sample=false always means greedy.
    """
    p = req.parameters
    if p.do_sample is not None:
        return p.do_sample
    return (p.temperature is not None and p.temperature > 0) or p.top_p is not None or (
        p.top_k is not None and p.top_k > 0)


def to_completion(req: LMIRequest, max_model_len: int, adapter: str | None = None) -> dict[str, Any]:
    """The vLLM CompletionRequest fields for an LMI request."""
    p = req.parameters
    max_new = p.max_new_tokens if p.max_new_tokens is not None else LMI_DEFAULT_MAX_NEW_TOKENS
    if max_new > max_model_len:
        raise LMIError(f"parameters.max_new_tokens: {max_new} is more than the model's context "
                       f"({max_model_len} tokens); allowed: 1 to {max_model_len}", "parameters.max_new_tokens")
    body: dict[str, Any] = {"prompt": req.inputs, "max_tokens": max_new, "stream": req.stream}
    if adapter:
        body["model"] = adapter
    if sampling_is_requested(req) and (p.temperature is None or p.temperature > 0):
        body["temperature"] = 1.0 if p.temperature is None else p.temperature
        if p.top_p is not None:
            body["top_p"] = p.top_p
        if p.top_k is not None:
            body["top_k"] = p.top_k if p.top_k > 0 else -1
        if p.min_p is not None:
            body["min_p"] = p.min_p
    else:
        body["temperature"] = 0.0  # greedy: vLLM ignores top_p/top_k/min_p then
    for lmi_name, vllm_name in (("seed", "seed"), ("repetition_penalty", "repetition_penalty"),
                                ("frequency_penalty", "frequency_penalty"),
                                ("presence_penalty", "presence_penalty"), ("min_new_tokens", "min_tokens")):
        v = getattr(p, lmi_name)
        if v is not None:
            body[vllm_name] = v
    stops = stop_strings(p)
    if len(stops) > (limit := max_stop_strings()):
        field = "parameters.stop" if p.stop else "parameters.stop_sequences"
        raise LMIError(f"{field}: {len(stops)} stop strings (stop and stop_sequences together); the limit is "
                       f"{limit} (the engine's VLLM_MAX_STOP_STRINGS)", field)
    if stops:
        body["stop"] = stops
    if p.truncate is not None:
        # TGI's truncate keeps the last `truncate` tokens of the prompt.
        body["truncate_prompt_tokens"] = p.truncate
        body["truncation_side"] = "left"
    if p.ignore_eos_token:
        body["ignore_eos"] = True
    # Non-streamed answers carry logprobs only with details=true: vLLM turns every logprob into a
    # Python object with a decoded token in the API server, which costs API-server CPU per token.
    # Streams always carry the chosen token's (0) because LMI's do, and pay that cost.
    if p.details or p.decoder_input_details:
        body["return_token_ids"] = True
    if p.details or req.stream:
        body["logprobs"] = 0
    if p.decoder_input_details:
        body["prompt_logprobs"] = 0
    return body


def max_stop_strings() -> int:
    """How many stop strings vLLM's request models accept (VLLM_MAX_STOP_STRINGS, 4 by default)."""
    import vllm.envs as envs
    return envs.VLLM_MAX_STOP_STRINGS


def finish_reason(reason: str | None, stop_reason: int | str | None) -> str | None:
    """vLLM's finish/stop reason in LMI's words: length, eos_token, stop_sequence."""
    if reason == "stop":
        return "stop_sequence" if isinstance(stop_reason, str) else "eos_token"
    return reason


def from_completion(req: LMIRequest, resp, decode=None) -> dict | list[dict]:
    """LMI's answer for a vLLM CompletionResponse: one object, or a list for list input.

    `decode(token_id) -> str` names prompt tokens vLLM gives no text for (the first one).
    """
    p = req.parameters
    prompts = req.prompts
    out = []
    for choice in sorted(resp.choices, key=lambda c: c.index):
        prompt = prompts[choice.index]
        item: dict[str, Any] = {"generated_text": (prompt + choice.text) if p.return_full_text else choice.text}
        if p.details or p.decoder_input_details:
            item["details"] = _details(req, prompt, choice, decode)
        out.append(item)
    return out[0] if isinstance(req.inputs, str) else out


def _details(req: LMIRequest, prompt: str, choice, decode) -> dict[str, Any]:
    p = req.parameters
    ids = list(choice.token_ids or [])
    d: dict[str, Any] = {"finish_reason": finish_reason(choice.finish_reason, choice.stop_reason),
                         "generated_tokens": len(ids), "inputs": prompt}
    d["seed"] = p.seed  # LMI reports it, null when the request set none
    if p.details:
        lp = choice.logprobs
        texts = lp.tokens if lp else [""] * len(ids)
        logprobs = lp.token_logprobs if lp else [None] * len(ids)
        d["tokens"] = [{"id": i, "text": t, "logprob": l} for i, t, l in zip(ids, texts, logprobs)]
    if p.decoder_input_details:
        d["prefill"] = _prefill(choice, decode)
    return d


def _prefill(choice, decode) -> list[dict[str, Any]]:
    """TGI's prefill tokens: the prompt's tokens with their logprobs (the first has none)."""
    out = []
    for tid, lp in zip(choice.prompt_token_ids or [], choice.prompt_logprobs or []):
        entry = lp.get(tid) if lp else None
        text = getattr(entry, "decoded_token", None)
        if text is None:
            text = decode(tid) if decode else ""
        out.append({"id": tid, "text": text,
                    "logprob": getattr(entry, "logprob", None)})
    return out


def vllm_error(message: str, param: str | None, status: int) -> LMIError:
    """A vLLM ErrorResponse re-worded with the LMI field names the client used."""
    field = _FIELD_FOR_PARAM.get(param or "", param)
    if field is None and "context length" in message:
        field = "inputs"
    for pat, name in _RENAMES:
        message = pat.sub(name, message)
    if field == "inputs" and "context length" in message:
        message += " (shorten the input, or set parameters.truncate)"
    # LMI answers every rejected request with 424; keep 5xx for the server's own failures.
    return LMIError(f"{field}: {message}" if field else message, field, 424 if status < 500 else status)


def completion_request(req: LMIRequest, handler, adapter: str | None):
    """An LMI request as vLLM's CompletionRequest for `handler`; vLLM's own checks on the translated values
    fail as vLLM's error."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    fields = to_completion(req, handler.model_config.max_model_len, adapter)
    try:
        return CompletionRequest.model_validate(fields)
    except Exception as e:
        raise vllm_error(first_line(e), getattr(e, "parameter", None), 400) from None


def from_exception(e: Exception) -> LMIError:
    """Classify an exception the way vLLM's own exception handler does, in LMI's shape."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    info = create_error_response(e).error
    if info.code >= 500:
        log.error("LMI request failed: %s", type(e).__name__, exc_info=True)
        return LMIError(f"internal error ({type(e).__name__})", None, info.code)
    return vllm_error(info.message, info.param, info.code)


def first_line(e: Exception) -> str:
    """A validation error's first complaint (`field.path: message`), or an exception's first line."""
    import pydantic
    if isinstance(e, pydantic.ValidationError):
        err = e.errors(include_url=False)[0]
        return f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def first_field(e: Exception) -> str | None:
    """The top-level field a validation error names first, if any."""
    import pydantic
    if isinstance(e, pydantic.ValidationError):
        loc = e.errors(include_url=False)[0]["loc"]
        return str(loc[0]) if loc else None
    return None
