"""The OpenAI-compatible HTTP API over an `Engine` (FastAPI).

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions.

- Chat completions accept `messages` (string contents, or lists of text parts and, for a vision-language model,
  `image_url` parts with base64 data URLs: `inference.images`), which are rendered in the model's chat format
  (`Engine.chat`). Supported: n, temperature, top_p, top_k (a vLLM extension), max_tokens /
  max_completion_tokens, stop (strings), logprobs, seed and stream (server-sent events sent while the batch
  decodes: new text every `Engine.stream_segment` decode steps, held back only where it could still become a stop
  string).
- Completions accept a prompt string or a list of token ids. Supported: n, temperature, top_p, top_k, max_tokens
  (0 with `echo` scores the prompt only), stop, logprobs, echo, seed, and vLLM's `prompt_logprobs` (0: each
  prompt token's own log-prob, in vLLM's format). Both take vLLM's `ignore_eos`.
- Generation ends at the chat format's end-of-turn token or the model's EOS, which are not part of the returned
  text. A stop string cuts the text before its first occurrence (finish_reason "stop"), and the token log-probs are
  cut with it.
- A malformed request gets a 400 with an OpenAI-style error body; the server keeps serving.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from sweet_jax.inference.images import ImageError, prompt_images, split_images
from sweet_jax.inference.sampling import Sample, SamplingParams


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's extension: only max_tokens ends a sample


class ChatBody(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)  # only the sampled token's log-prob is returned
    stream: bool = False


class CompletionBody(_Body):
    prompt: str | list[int] | list[str]
    max_tokens: int = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=0)
    prompt_logprobs: int | None = Field(None, ge=0, le=0)  # vLLM's extension: the prompt tokens' log-probs
    echo: bool = False
    stream: bool = False


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _stops(stop) -> list[str]:
    return [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]


@dataclasses.dataclass
class _Piece:
    text: str  # new text
    tokens: list[tuple[str, float, int]]  # (token text, log-prob, character offset) of the tokens it completes
    finish_reason: str | None  # set once, with the last piece


class _Detokenizer:
    """One sample's tokens -> text, as they arrive, with stop strings applied.

    - The final stop token (EOT / EOS) is not part of the text, nor is any other special token (vLLM's default
      skip_special_tokens): a header token inside a reply would break the chat format of the conversation.
    - A stop string cuts the text before its first occurrence (finish_reason "stop"); the tokens are cut with it.
    - While a sample runs, the text that could still turn into a stop string, and an incomplete UTF-8 character,
      are held back, so streamed text never has to be taken back.
    - A token counts as emitted once all of its text has been; its text is what it adds to the decoded text.
    Decoding is incremental: only the tokens after the last complete character are decoded again."""

    def __init__(self, tokenizer, stop_tokens, stops: list[str]):
        self.tok, self.stop_tokens, self.stops = tokenizer, set(stop_tokens), stops
        self.hold = max((len(x) for x in stops), default=1) - 1
        self.lps: list[float] = []
        self.ends: list[int] = []  # ends[k]: length of the text of tokens 0..k
        self.settled, self.settled_len, self.pending = "", 0, []  # text up to a character boundary; tokens after it
        self.sent, self.sent_tokens, self.finished = 0, 0, False

    def feed(self, tokens: list[int], logprobs: list[float], finish_reason: str | None) -> _Piece:
        if self.finished:
            return _Piece("", [], None)
        if finish_reason is not None and tokens and tokens[-1] in self.stop_tokens:
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        for t, lp in zip(tokens, logprobs):
            self.pending.append(t)
            tail = self.tok.decode(self.pending, skip_special_tokens=True)
            self.ends.append(self.settled_len + len(tail))
            self.lps.append(lp)
            if not tail.endswith("\ufffd"):  # a character boundary: settle
                self.settled += tail
                self.settled_len, self.pending = len(self.settled), []
        text = self.settled + (self.tok.decode(self.pending, skip_special_tokens=True) if self.pending else "")
        cut = min((i for i in (text.find(x) for x in self.stops) if i >= 0), default=-1)
        reason = None
        if cut >= 0:
            end, reason = cut, "stop"
        elif finish_reason is not None:
            end, reason = len(text), finish_reason
        else:
            end = len(text) - self.hold
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        end = max(end, self.sent)
        done = []
        while self.sent_tokens < len(self.ends) and self.ends[self.sent_tokens] <= end:
            k = self.sent_tokens
            start = self.ends[k - 1] if k else 0
            done.append((text[start:self.ends[k]], self.lps[k], start))
            self.sent_tokens += 1
        piece = _Piece(text[self.sent:end], done, reason)
        self.sent, self.finished = end, reason is not None
        return piece


def create_app(engine) -> FastAPI:
    app = FastAPI(title="sweet_jax", docs_url=None, redoc_url=None)

    @app.on_event("startup")
    async def _start():
        await engine.start()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}" if where else str(exc))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [{"id": engine.model_name, "object": "model", "created": 0,
                                            "owned_by": "sweet_jax", "max_model_len": engine.max_model_len}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody):
        return await chat_completion(engine, body)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody):
        return await text_completion(engine, body)

    return app


def _detokenizer(engine, stop) -> _Detokenizer:
    return _Detokenizer(engine.tokenizer, engine.stop_tokens, _stops(stop))


def _sampling(body, max_tokens: int) -> tuple[SamplingParams, int, int]:
    """(sampling parameters, n, seed) of a request; no seed: a random one."""
    seed = body.seed if body.seed is not None else int.from_bytes(uuid.uuid4().bytes[:4], "little")
    return (SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=max(body.top_k, 0),
                           max_tokens=max_tokens), body.n, seed)


async def chat_completion(engine, body: ChatBody):
    """/v1/chat/completions: the rendered conversation (and its images) decoded, streamed or whole."""
    if engine.chat_error:
        return _error(400, engine.chat_error)
    try:
        messages, pil_images = split_images(body.messages)
        if pil_images and engine.image_settings is None:
            return _error(400, f"messages: {engine.model_name} is a text model: it takes no images")
        prompt = engine.chat.render_text(messages, add_generation_prompt=True)
    except ImageError as e:
        return _error(400, str(e))
    except ValueError as e:
        return _error(400, f"messages: {e}")
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    images = None
    if pil_images:
        try:
            ids, images = prompt_images(ids, engine.cfg, pil_images, engine.image_settings)
        except ValueError as e:
            return _error(400, f"messages: {e}")
    max_tokens = body.max_completion_tokens or body.max_tokens or min(1024, engine.max_model_len - len(ids))
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    try:
        if body.stream:
            deltas = engine.stream(ids, *_sampling(body, max(1, max_tokens)), ignore_eos=body.ignore_eos,
                                   images=images)
            return StreamingResponse(_chat_stream(rid, created, engine.model_name, deltas, body.n,
                                                  [_detokenizer(engine, body.stop) for _ in range(body.n)],
                                                  body.logprobs), media_type="text/event-stream")
        samples = await engine.generate(ids, *_sampling(body, max(1, max_tokens)), ignore_eos=body.ignore_eos,
                                        images=images)
    except ValueError as e:
        return _error(400, str(e))
    completion = sum(len(s.tokens) for s in samples)
    choices = []
    for i, s in enumerate(samples):
        piece = _detokenizer(engine, body.stop).feed(s.tokens, s.logprobs, s.finish_reason)
        choices.append({"index": i, "message": {"role": "assistant", "content": piece.text},
                        "finish_reason": piece.finish_reason,
                        "logprobs": {"content": [_token_logprob(t, lp) for t, lp, _ in piece.tokens]}
                        if body.logprobs else None})
    return {"id": rid, "object": "chat.completion", "created": created, "model": engine.model_name,
            "choices": choices, "usage": {"prompt_tokens": len(ids), "completion_tokens": completion,
                                          "total_tokens": len(ids) + completion}}


async def text_completion(engine, body: CompletionBody):
    """/v1/completions: a prompt (text or token ids) decoded, and with echo or prompt_logprobs scored."""
    if body.stream:
        return _error(400, "stream: streaming is supported by /v1/chat/completions only")
    if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
        if len(body.prompt) != 1:
            return _error(400, "prompt: one prompt per request")
        body.prompt = body.prompt[0]
    ids = (list(body.prompt) if isinstance(body.prompt, list)
           else engine.tokenizer.encode(body.prompt, add_special_tokens=False))
    if not ids:
        return _error(400, "prompt: empty")
    if any(not 0 <= t < engine.cfg.vocab_size for t in ids):
        return _error(400, f"prompt: token ids must lie in [0, {engine.cfg.vocab_size})")
    if body.max_tokens == 0 and not body.echo:
        return _error(400, "max_tokens: 0 is only meaningful with echo (prompt scoring)")
    try:
        scored = (body.echo and body.logprobs is not None) or body.prompt_logprobs is not None
        prompt_lps = engine.prompt_logprobs(ids) if scored else None
        samples = (await engine.generate(ids, *_sampling(body, body.max_tokens), ignore_eos=body.ignore_eos)
                   if body.max_tokens > 0
                   else [Sample([], [], "length")] * body.n)
    except ValueError as e:
        return _error(400, str(e))
    prompt_text = engine.tokenizer.decode(ids)
    prompt_pieces = [engine.tokenizer.decode([t]) for t in ids]
    choices = []
    for i, s in enumerate(samples):
        piece = _detokenizer(engine, body.stop).feed(s.tokens, s.logprobs, s.finish_reason)
        choice = {"index": i, "text": (prompt_text + piece.text) if body.echo else piece.text,
                  "finish_reason": piece.finish_reason, "logprobs": None}
        if body.logprobs is not None:
            pieces = [t for t, _, _ in piece.tokens]
            lps = [lp for _, lp, _ in piece.tokens]
            offsets = [o for _, _, o in piece.tokens]
            if body.echo:
                starts = [sum(len(p) for p in prompt_pieces[:k]) for k in range(len(prompt_pieces))]
                pieces, lps = prompt_pieces + pieces, prompt_lps + lps
                offsets = starts + [len(prompt_text) + o for o in offsets]
            choice["logprobs"] = {"tokens": pieces, "token_logprobs": lps, "top_logprobs": None,
                                  "text_offset": offsets}
        if body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": lp, "rank": None, "decoded_token": piece}}
                for t, lp, piece in zip(ids[1:], prompt_lps[1:], prompt_pieces[1:])]
        choices.append(choice)
    completion = sum(len(s.tokens) for s in samples)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": engine.model_name, "choices": choices,
            "usage": {"prompt_tokens": len(ids), "completion_tokens": completion,
                      "total_tokens": len(ids) + completion}}


def _token_logprob(piece: str, lp: float) -> dict:
    return {"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}


async def _chat_stream(rid, created, model, deltas, n: int, detokenizers: list[_Detokenizer], with_logprobs: bool):
    """Server-sent events as the engine decodes: a role chunk per choice, then a content chunk per choice whenever
    new text is safe to send (see `_Detokenizer`), a finish chunk per choice, and [DONE]. An engine error ends the
    stream with an error event."""
    def chunk(index, delta, reason=None, logprobs=None):
        return "data: " + json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                                      "model": model, "choices": [{"index": index, "delta": delta,
                                                                   "logprobs": logprobs,
                                                                   "finish_reason": reason}]}) + "\n\n"

    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    try:
        async for drow in deltas:
            for i, (delta, detok) in enumerate(zip(drow, detokenizers)):
                piece = detok.feed(delta.tokens, delta.logprobs, delta.finish_reason)
                if piece.text or piece.tokens:
                    yield chunk(i, {"content": piece.text}, logprobs={"content": [
                        _token_logprob(t, lp) for t, lp, _ in piece.tokens]} if with_logprobs else None)
                if piece.finish_reason:
                    yield chunk(i, {}, piece.finish_reason)
    except Exception as e:  # the response has started: report in-band
        yield "data: " + json.dumps({"error": {"message": str(e), "type": "server_error", "code": 500}}) + "\n\n"
        return
    yield "data: [DONE]\n\n"
