"""An asyncio client for OpenAI-compatible endpoints (vLLM, the project's own server, hosted APIs). Imports no JAX.

    client = LLMClient(base_url="http://127.0.0.1:8000/v1", model="the-served-model-name")
    reply = await client.chat([{"role": "user", "content": "hi"}], temperature=0, max_tokens=64)
    text = await client.complete(templated_prompt, temperature=1.0, max_tokens=1024)

- The API key comes from the environment variable `api_key_env` (default OPENAI_API_KEY; a placeholder is used when
  it is unset, which local servers accept).
- At most `concurrency` requests are in flight per client.
- Each attempt has a timeout. Rate limits (429), server errors (5xx), timeouts and dropped connections are retried
  with exponential backoff and jitter, up to `max_retries` times. Other errors (a 400, say) are raised at once:
  callers decide (the simulator turns a BadRequestError into "No response.", as the official code does).
- A server that could not be reached is watched through its /health during the backoff: once it has been seen down
  and then answers again (a restarted server), the request is retried at once, not at the end of a backoff that by
  then may have grown to a minute.
- `base_url` may list several servers of the same model, comma-separated: requests go to them in turn, and a
  retried request goes to the next one.
- `stats` counts calls, retries and failures, for progress bars.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import random
import time
import urllib.error
import urllib.request

import openai

RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError, openai.APIConnectionError)


def png_data_url(path: str) -> str:
    """A PNG file as a base64 data URL, for vision messages."""
    with open(path, "rb") as fh:
        return "data:image/png;base64," + base64.b64encode(fh.read()).decode("ascii")


def _retryable(e: Exception) -> bool:
    if isinstance(e, RETRYABLE):
        return True
    return isinstance(e, openai.APIStatusError) and (e.status_code >= 500 or e.status_code in (408, 409, 429))


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at `url` (its root, without /v1) answers /health."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@dataclasses.dataclass
class Stats:
    calls: int = 0
    retries: int = 0
    failures: int = 0


class LLMClient:
    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", concurrency: int = 32,
                 timeout: float = 300.0, max_retries: int = 8, backoff: float = 1.0, max_backoff: float = 60.0,
                 seed: int | None = None):
        self.model = model
        self.base_url = base_url
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stats = Stats()
        self._rng = random.Random(seed)
        self._sem = asyncio.Semaphore(concurrency)
        urls = [u.strip() for u in base_url.split(",") if u.strip()]
        if not urls:
            raise ValueError("base_url: no server URL given")
        key = os.environ.get(api_key_env) or "EMPTY"
        self._clients = [openai.AsyncOpenAI(base_url=u, api_key=key, timeout=timeout, max_retries=0) for u in urls]
        self._turn = 0

    @property
    def _client(self) -> openai.AsyncOpenAI:
        """The next server in turn."""
        self._turn = (self._turn + 1) % len(self._clients)
        return self._clients[self._turn]

    async def _call(self, method: str, **kw):
        attempt = 0
        while True:
            async with self._sem:
                self.stats.calls += 1
                client = self._client
                fn = client.chat.completions.create if method == "chat" else client.completions.create
                try:
                    return await fn(model=self.model, **kw)
                except Exception as e:
                    if not _retryable(e) or attempt >= self.max_retries:
                        self.stats.failures += 1
                        raise
                    error = e
            attempt += 1
            self.stats.retries += 1
            delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
            await self._backoff(client, delay * (0.5 + self._rng.random()), error)

    async def _backoff(self, client: openai.AsyncOpenAI, seconds: float, error: Exception) -> None:
        """Sleeps `seconds`; after a connection that failed, less: until the server, seen down at least once, answers
        /health again."""
        if not isinstance(error, openai.APIConnectionError) or isinstance(error, openai.APITimeoutError):
            await asyncio.sleep(seconds)
            return
        root = str(client.base_url).rstrip("/").removesuffix("/v1")
        deadline, seen_down = time.monotonic() + seconds, False
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(1.0, left))
            up = await asyncio.to_thread(healthy, root)
            if up and seen_down:
                return
            seen_down = seen_down or not up

    async def chat(self, messages: list[dict], **kw) -> str:
        """The first choice's message text of a chat completion."""
        resp = await self._call("chat", messages=messages, **kw)
        return resp.choices[0].message.content or ""

    async def complete(self, prompt: str, **kw) -> str:
        """The first choice's text of a (legacy) completion of an already-templated prompt."""
        resp = await self._call("completions", prompt=prompt, **kw)
        return resp.choices[0].text or ""

    async def completion(self, prompt: str | list[int], **kw):
        """The whole completion response (every choice, with log-probs when asked for)."""
        return await self._call("completions", prompt=prompt, **kw)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
