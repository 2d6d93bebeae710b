"""Bounded loopback load on the shared real server (bench/http/load.py): zero failures, and every
answer under load -- LMI, OpenAI completion and chat, streamed and not -- equals the same
prompt's greedy answer taken alone. CI's size by default; LOAD_CLIENTS / LOAD_REQUESTS /
LOAD_TOKENS make it bigger by hand.
"""
from __future__ import annotations

import asyncio
import json
import os

import pytest

from bench.http import load

pytestmark = pytest.mark.engine


def test_concurrent_mixed_load_has_no_failures_and_no_lost_tokens(server):
    clients = int(os.environ.get("LOAD_CLIENTS", "64"))
    requests = int(os.environ.get("LOAD_REQUESTS", "384"))
    rep = asyncio.run(load.run(server.url, clients, requests, int(os.environ.get("LOAD_TOKENS", "16"))))
    print("load:", json.dumps({"clients": clients, **rep.summary()}))
    assert not rep.failures, f"{len(rep.failures)} of {requests} failed; first: {rep.failures[:5]}"
    assert len(rep.latencies) == requests
    assert rep.first_bytes and max(rep.first_bytes) <= max(rep.latencies)
