"""Which LoRA adapter a request on /invocations names: one rule for every body kind.

A request may name its adapter in three places:
- SageMaker's adapter header (X-Amzn-SageMaker-Adapter-Identifier);
- LMI's body field `adapters`: a name, or a list repeating one name (null: not given);
- OpenAI's body field `model`, where it names an adapter the server serves.
Every place given must name the same adapter, one the server serves (or one a LoRA resolver may load).
A request that breaks this gets 424 naming the field or header; a request that names none is served by
the base model.
"""
from __future__ import annotations

from .errors import LMIError

ADAPTER_HEADER = b"x-amzn-sagemaker-adapter-identifier"  # SageMaker's LoRA adapter header
HEADER_NAME = "X-Amzn-SageMaker-Adapter-Identifier"


def header_adapter(scope) -> str | None:
    """The adapter SageMaker's adapter header names, if the request has the header."""
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == ADAPTER_HEADER), None)


def requested_adapter(scope, doc) -> str | None:
    """The adapter the request (`scope`'s headers and the JSON body `doc`) names by the rule above, or None."""
    models = getattr(scope["app"].state, "openai_serving_models", None)
    served = getattr(models, "lora_requests", None) or {}
    asked: list[tuple[str, str]] = []  # (field, name)
    if isinstance(doc, dict):
        adapters = doc.get("adapters")
        if adapters is not None:
            names = adapters if isinstance(adapters, list) else [adapters]
            if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != 1:
                raise LMIError("adapters: give one LoRA adapter's name (a string, or a list of the same name)",
                               "adapters")
            asked.append(("adapters", names[0]))
        model = doc.get("model")
        if isinstance(model, str) and model in served:
            asked.append(("model", model))
    header = header_adapter(scope)
    if header:
        asked.append((HEADER_NAME, header))
    if len({name for _, name in asked}) > 1:
        field = asked[0][0]
        given = ", ".join(f"{where} {name!r}" for where, name in asked)
        raise LMIError(f"{field}: the request names different LoRA adapters ({given}); name one", field)
    if not asked:
        return None
    field, name = asked[0]
    if name not in served and not getattr(models, "lora_resolvers", None):
        listed = ", ".join(sorted(served)) or "none (the model has no adapters/ folder)"
        raise LMIError(f"{field}: no LoRA adapter named {name!r}; served: {listed}", field)
    return name
