"""LMI's `application/jsonlines` token stream, made straight from the engine's outputs.

One JSON object per generated token, each ending in "\n", nothing else on the wire:

    {"index": 0, "token": {"id": 123, "text": "{", "logprob": -0.4}, "generated_text": null, "details": null}
    ...
    {"index": 0, "token": {...}, "generated_text": "<full text>",
     "details": {"finish_reason": "length", "generated_tokens": 30, "input_length": 5, "seed": null}}

`index` is the input's position: a list of inputs streams its records interleaved, as LMI
does, each input ending with its own record carrying `generated_text`. With tgi_compat the
same records go out as TGI's server-sent events (`data: {...}\n\n`, tokens with `special`),
which Hugging Face's clients parse.

SageMaker's InvokeEndpointWithResponseStream hands the client arbitrary byte slices, so a
client splits on "\n" and parses each line. The visible text of an engine step goes on its
last token (earlier tokens of the same step get ""), so the token texts always concatenate
to `generated_text` (without the prompt when return_full_text) even when vLLM holds text
back (stop strings, partial UTF-8). A stream that fails after it started ends with one
complete record naming the error: `{"index": i, "error": "...", "code": 500}`.

Why not translate vLLM's own SSE stream: vLLM builds a pydantic chunk per token and dumps it
to JSON, and parsing that back costs as much again; this module formats each record straight
from the RequestOutput, a small fraction of either. The request still goes through the
completion handler's own preparation -- model check, prompt rendering and length limits,
sampling defaults, request logging -- the same steps in the same order as
OpenAIServingCompletion._create_completion in vLLM 0.32 (pinned; the tests cover it).
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from .errors import LMIError
from .schema import LMIRequest
from .translate import finish_reason, vllm_error

MEDIA_TYPE = "application/jsonlines"
TGI_MEDIA_TYPE = "text/event-stream"
log = logging.getLogger("vllm.lmi")


@dataclass
class Opened:
    """The engine's output streams of one request, one per input, with their prompt lengths."""
    streams: list
    prompt_lens: list[int]


async def open_streams(handler, creq, raw_request) -> Opened:
    """Prepare the request as vLLM's completion handler does; start one engine request per input."""
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

    inputs = await handler.render_completion_request(creq)
    if isinstance(inputs, ErrorResponse):
        raise vllm_error(inputs.error.message, inputs.error.param, inputs.error.code)
    base = f"cmpl-{handler._base_request_id(raw_request, creq.request_id)}"
    raw_request.state.request_metadata = RequestResponseMetadata(request_id=base)
    lora_request = handler._maybe_get_adapters(creq)
    trace_headers = await handler._get_trace_headers(raw_request.headers)
    streams, prompt_lens = [], []
    for i, engine_input in enumerate(inputs):
        request_id = f"{base}-{i}"
        prompt_len = handler._extract_prompt_len(engine_input)
        max_tokens = get_max_tokens(handler.model_config.max_model_len, creq.max_tokens, prompt_len,
                                    handler.default_sampling_params, handler.override_max_tokens,
                                    truncate_prompt_tokens=creq.truncate_prompt_tokens)
        params = creq.to_sampling_params(max_tokens, handler.default_sampling_params)
        handler._log_inputs(request_id, engine_input, params=params, lora_request=lora_request)
        streams.append(handler.engine_client.generate(
            engine_input, params, request_id, lora_request=lora_request, trace_headers=trace_headers,
            priority=handler._get_priority(creq, raw_request),
            data_parallel_rank=handler._get_data_parallel_rank(raw_request),
            session_id=handler._get_session_id(creq, raw_request)))
        prompt_lens.append(prompt_len)
    return Opened(streams, prompt_lens)


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _logprob(lp: float | None) -> str:
    return repr(float(lp)) if lp is not None and math.isfinite(lp) else "null"


class _Format:
    """LMI jsonlines, or (tgi_compat) the same records as TGI's server-sent events."""

    def __init__(self, tgi: bool, special_ids: frozenset[int] = frozenset()):
        self.tgi, self.special_ids = tgi, special_ids
        self.media_type = TGI_MEDIA_TYPE if tgi else MEDIA_TYPE

    def token(self, tid: int, text: str, lp: float | None) -> str:
        # The hot path (one record per generated token): format directly, JSON-encoding only the text.
        if self.tgi:
            special = "true" if tid in self.special_ids else "false"
            return f'{{"id":{tid},"text":{_dumps(text)},"logprob":{_logprob(lp)},"special":{special}}}'
        return f'{{"id":{tid},"text":{_dumps(text)},"logprob":{_logprob(lp)}}}'

    def record(self, body: str) -> str:
        return f"data:{body}\n\n" if self.tgi else body + "\n"

    def token_record(self, index: int, tid: int, text: str, lp: float | None) -> str:
        return self.record(f'{{"index":{index},"token":{self.token(tid, text, lp)},'
                           f'"generated_text":null,"details":null}}')

    def error(self, index: int, message: str) -> bytes:
        doc = {"index": index, "error": message, "error_type": "generation"} if self.tgi else \
            {"index": index, "error": message, "code": 500}
        return self.record(_dumps(doc)).encode()


@dataclass
class _Seq:
    """What one input's stream has produced so far."""
    prompt_len: int
    parts: list[str] = field(default_factory=list)
    generated: int = 0
    carry: str = ""
    finished: bool = False


async def jsonlines(req: LMIRequest, opened: Opened, tgi: bool = False,
                    special_ids: frozenset[int] = frozenset()) -> AsyncIterator[bytes]:
    """LMI records from the engine's RequestOutput deltas; one write per engine step."""
    from vllm.utils.async_utils import merge_async_iterators

    fmt = _Format(tgi, special_ids)
    prompts = req.prompts
    seqs = [_Seq(n) for n in opened.prompt_lens]
    merged = merge_async_iterators(*opened.streams)
    failed: Exception | None = None
    try:
        # Run the engine's generators to their natural end after the final output: closing one
        # early (return/break) makes vLLM treat the request as abandoned and send the engine an
        # abort for it: one extra engine message per request, which costs engine CPU.
        async for index, res in merged:
            seq = seqs[index]
            if seq.finished:
                continue
            out = res.outputs[0]
            ids = out.token_ids
            text = out.text
            seq.parts.append(text)
            if ids:
                text, seq.carry = seq.carry + text, ""
            else:
                seq.carry += text
            seq.generated += len(ids)
            lps = out.logprobs
            logprobs = [None] * len(ids)
            if lps:
                for j, tid in enumerate(ids):
                    entry = lps[j].get(tid) if j < len(lps) and lps[j] else None
                    logprobs[j] = entry.logprob if entry is not None else None
            last = len(ids) - 1
            if out.finish_reason is None:
                yield "".join(fmt.token_record(index, tid, text if j == last else "", logprobs[j])
                              for j, tid in enumerate(ids)).encode()
                continue
            seq.finished = True
            if out.finish_reason == "error":
                log.error("LMI stream: the engine reported an error for input %d after %d tokens", index,
                          seq.generated)
                yield fmt.error(index, "the engine failed while generating")
                continue
            lines = [fmt.token_record(index, tid, "", logprobs[j]) for j, tid in enumerate(ids[:-1])]
            details = {"finish_reason": finish_reason(out.finish_reason, out.stop_reason),
                       "generated_tokens": seq.generated, "input_length": seq.prompt_len,
                       "seed": req.parameters.seed}
            prefix = prompts[index] if req.parameters.return_full_text else ""
            token = None if not ids else json.loads(fmt.token(ids[-1], text, logprobs[-1]))
            final = {"index": index, "token": token, "generated_text": prefix + "".join(seq.parts),
                     "details": details}
            yield ("".join(lines) + fmt.record(_dumps(final))).encode()
    except LMIError:
        raise
    except Exception as e:  # e.g. the engine died mid-stream: end with a parseable record
        failed = e
    finally:
        # client gone or we failed: closing the merged generator closes vLLM's, which aborts
        # the engine requests still running
        if not all(s.finished for s in seqs):
            await merged.aclose()
    if failed is not None:
        log.error("LMI stream failed: %s", type(failed).__name__, exc_info=failed)
    for index, seq in enumerate(seqs):
        if seq.finished:
            continue
        if failed is not None:
            yield fmt.error(index, f"generation failed after {seq.generated} tokens ({type(failed).__name__})")
        else:
            log.error("LMI stream: the engine's output for input %d ended before it finished", index)
            yield fmt.error(index, f"generation ended after {seq.generated} tokens, before completion")

