"""The `route` attribute of SageMaker's custom attributes on POST /invocations, as AWS's vLLM image reads it.

SageMaker hands the caller's CustomAttributes to the container as the header X-Amzn-SageMaker-Custom-Attributes,
opaque: by convention `key=value` attributes separated by commas (or semicolons). `route=<path>` names the vLLM
route that serves the body (`route=/v1/completions`, `route=/v1/tokenize`, ...): the body goes to that route as
sent and is answered as that route answers it, its own guards included (with an API key set, vLLM's /v1
routes want it, as they do when called directly). The LoRA adapter the request names (adapters.py) goes in
the body's `model`. Other attributes are the caller's own and are left alone.

- a `route` that is not a path (`/` then path characters, no query), or two `route`s that differ: 400;
- a path the server serves no route for: 404 naming it and the POST routes it serves;
- a path it serves, but not for POST: 405 naming the methods it takes;
- `route=/invocations` is /invocations itself, as if no route were given;
- a control route of the server (profiling, sleep, weight updates, cache resets, LoRA loading, scaling, ...): 403.
  The routes open to a body are the inference routes: `/v1/...` and `/v2/...` (but LoRA loading), `/tokenize`,
  `/detokenize`, `/classify`, `/score`, `/rerank`, `/pooling` and `/inference/...`.
"""
from __future__ import annotations

import re

from .errors import LMIError

HEADER = b"x-amzn-sagemaker-custom-attributes"
NAME = "X-Amzn-SageMaker-Custom-Attributes"
# RFC 3986 path characters, less ";" and "," (they separate attributes); no query or fragment
_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+=:@%/-]*")


def requested_route(scope) -> str | None:
    """The path the request's `route` attribute names, or None (no attribute, or /invocations itself)."""
    routes = []
    for name, value in scope["headers"]:
        if name != HEADER:
            continue
        for attribute in re.split(r"[,;]", value.decode("latin-1")):
            key, eq, path = attribute.strip().partition("=")
            if key.strip() != "route":
                continue
            path = path.strip()
            if not eq or not _PATH.fullmatch(path):
                raise LMIError(f"{NAME}: route={path!r} is not a path; name the vLLM route that serves the body, "
                               "e.g. route=/v1/completions", NAME, 400)
            routes.append(path)
    if len(set(routes)) > 1:
        raise LMIError(f"{NAME}: the attributes name different routes ({', '.join(routes)}); name one", NAME, 400)
    return routes[0] if routes and routes[0] != "/invocations" else None


_INFERENCE = re.compile(r"/(v1|v2|inference)/.*|/(tokenize|detokenize|classify|score|rerank|pooling)")
_CONTROL = re.compile(r"/v1/(load|unload)_lora_adapter")


def check_served(scope, route: str) -> None:
    """Raise LMIError unless `route` is an inference route the app in `scope` serves for POST."""
    from starlette.routing import Match

    if not _INFERENCE.fullmatch(route) or _CONTROL.fullmatch(route):
        raise LMIError(f"{NAME}: route={route} is not an inference route; /invocations forwards bodies to /v1/..., "
                       "/tokenize, /detokenize, /classify, /score, /rerank and /pooling only", NAME, 403)

    probe = {**scope, "path": route, "raw_path": route.encode(), "method": "POST"}
    methods: set[str] = set()
    for r in scope["app"].router.routes:
        match, _ = r.matches(probe)
        if match is Match.FULL:
            return
        if match is Match.PARTIAL:
            methods |= set(getattr(r, "methods", None) or ())
    if methods:
        raise LMIError(f"{NAME}: route={route} takes {', '.join(sorted(methods))}, not POST; name a route that "
                       "takes a POST body", NAME, 405)
    served = sorted({r.path for r in scope["app"].router.routes
                     if "POST" in (getattr(r, "methods", None) or ()) and r.path != "/invocations"})
    raise LMIError(f"{NAME}: route={route}: this server serves no such route; POST routes served: "
                   f"{', '.join(served)}", NAME, 404)
