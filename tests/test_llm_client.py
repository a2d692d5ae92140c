"""`colbench.client.LLMClient`'s retries against a server that goes away and comes back (a restart)."""

import asyncio
import socket
import threading
import time

from fake_openai import SIMULATOR_REPLY, FakeOpenAI

from sweet_jax.colbench.client import LLMClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ask(url: str, backoff: float) -> tuple[str, float]:
    async def go():
        client = LLMClient(url, "fake", backoff=backoff, max_retries=2, seed=0)
        try:
            return await client.chat([{"role": "user", "content": "hi"}], max_tokens=8)
        finally:
            await client.close()

    t0 = time.monotonic()
    reply = asyncio.run(go())
    return reply, time.monotonic() - t0


def test_a_request_to_a_restarting_server_is_retried_as_soon_as_it_answers_again():
    """The server is down for 2 s. The first backoff is 10 to 30 s (backoff 20, jitter 0.5 to 1.5), but the client
    watches /health and retries within about a second of the server's return."""
    port = _free_port()
    up = []
    threading.Timer(2.0, lambda: up.append(FakeOpenAI([], port=port).__enter__())).start()  # nothing listens until then
    try:
        reply, seconds = _ask(f"http://127.0.0.1:{port}/v1", backoff=20.0)
    finally:
        for server in up:
            server.__exit__()
    assert reply == SIMULATOR_REPLY
    assert 2.0 <= seconds < 6.0, seconds


def test_a_server_that_was_never_seen_down_gets_the_whole_backoff():
    """A dropped connection from a server whose /health answers throughout (an overloaded server, say) is retried
    after the backoff, as before: the early retry is only for a server seen down and then back."""
    server = FakeOpenAI([], fault_rate=1.0)
    server.counts["requests"] = 1  # the first request's fault is the third kind, a dropped connection
    with server:
        threading.Timer(0.5, lambda: setattr(server, "fault_rate", 0.0)).start()
        reply, seconds = _ask(server.url, backoff=4.0)  # the first backoff: 2 to 6 s
    assert reply == SIMULATOR_REPLY and server.counts["drop"] == 1
    assert seconds >= 2.0, seconds
