"""The OpenAI-compatible HTTP API over an `Engine` (FastAPI).

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions.

- Chat completions accept `messages` (string contents, or lists of text parts), which are rendered in the Llama-3.1
  chat format. Supported: n, temperature, top_p, top_k (a vLLM extension), max_tokens / max_completion_tokens,
  stop (strings), logprobs, seed and stream (server-sent events, one chunk per token).
- Completions accept a prompt string or a list of token ids. Supported: n, temperature, top_p, top_k, max_tokens
  (0 with `echo` scores the prompt only), stop, logprobs, echo and seed.
- Generation ends at <|eot_id|> or the model's EOS, which are not part of the returned text. A stop string cuts the
  text before its first occurrence (finish_reason "stop"), and the token log-probs are cut with it.
- A malformed request gets a 400 with an OpenAI-style error body; the server keeps serving.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from sweet_jax.chat import render_text
from sweet_jax.generate import Sample, SamplingParams


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    stop: str | list[str] | None = None
    seed: int | None = None


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
    echo: bool = False
    stream: bool = False


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _stops(stop) -> list[str]:
    return [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]


class _Text:
    """Generated tokens -> (text, token strings, log-probs, finish reason), with stop strings applied. The final
    stop token (EOT / EOS) is not part of the text."""

    def __init__(self, tokenizer, stop_tokens):
        self.tok, self.stop_tokens = tokenizer, set(stop_tokens)

    def __call__(self, sample: Sample, stops: list[str]):
        ids, lps = list(sample.tokens), list(sample.logprobs)
        if ids and ids[-1] in self.stop_tokens:
            ids, lps = ids[:-1], lps[:-1]
        text = self.tok.decode(ids)
        reason = sample.finish_reason
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        pieces, offsets, pos = [], [], 0
        for t in ids:
            piece = self.tok.decode([t])
            pieces.append(piece)
            offsets.append(pos)
            pos += len(piece)
        if cut >= 0:
            text, reason = text[:cut], "stop"
            keep = sum(1 for o, p in zip(offsets, pieces) if o + len(p) <= cut)
            pieces, lps, offsets = pieces[:keep], lps[:keep], offsets[:keep]
        return text, pieces, lps, offsets, reason


def create_app(engine) -> FastAPI:
    app = FastAPI(title="sweet_jax", docs_url=None, redoc_url=None)
    text_of = _Text(engine.tokenizer, engine.stop_tokens)

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

    def _sampling(body, max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=max(body.top_k, 0),
                              max_tokens=max_tokens)

    async def _samples(prompt_ids, body, max_tokens):
        seed = body.seed if body.seed is not None else int.from_bytes(uuid.uuid4().bytes[:4], "little")
        return await engine.generate(prompt_ids, _sampling(body, max_tokens), body.n, seed)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody):
        try:
            messages = []
            for i, m in enumerate(body.messages):
                content = m.get("content")
                if isinstance(content, list):
                    if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                        return _error(400, f"messages.{i}.content: only text parts are supported by this model")
                    content = "".join(p.get("text", "") for p in content)
                messages.append({"role": m.get("role"), "content": content})
            prompt = render_text(messages, add_generation_prompt=True)
        except ValueError as e:
            return _error(400, f"messages: {e}")
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        max_tokens = body.max_completion_tokens or body.max_tokens or min(1024, engine.max_model_len - len(ids))
        try:
            samples = await _samples(ids, body, max(1, max_tokens))
        except ValueError as e:
            return _error(400, str(e))
        rid, created, stops = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), _stops(body.stop)
        outs = [text_of(s, stops) for s in samples]
        usage = {"prompt_tokens": len(ids), "completion_tokens": sum(len(s.tokens) for s in samples),
                 "total_tokens": len(ids) + sum(len(s.tokens) for s in samples)}
        if body.stream:
            return StreamingResponse(_chat_stream(rid, created, engine.model_name, outs, body.logprobs),
                                     media_type="text/event-stream")
        choices = []
        for i, (text, pieces, lps, _, reason) in enumerate(outs):
            choice = {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                      "logprobs": None}
            if body.logprobs:
                choice["logprobs"] = {"content": [_token_logprob(p, lp) for p, lp in zip(pieces, lps)]}
            choices.append(choice)
        return {"id": rid, "object": "chat.completion", "created": created, "model": engine.model_name,
                "choices": choices, "usage": usage}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody):
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
            prompt_lps = engine.prompt_logprobs(ids) if body.echo and body.logprobs is not None else None
            samples = (await _samples(ids, body, body.max_tokens) if body.max_tokens > 0
                       else [Sample([], [], "length")] * body.n)
        except ValueError as e:
            return _error(400, str(e))
        prompt_text = engine.tokenizer.decode(ids)
        prompt_pieces = [engine.tokenizer.decode([t]) for t in ids]
        stops = _stops(body.stop)
        choices = []
        for i, s in enumerate(samples):
            text, pieces, lps, offsets, reason = text_of(s, stops)
            choice = {"index": i, "text": (prompt_text + text) if body.echo else text, "finish_reason": reason,
                      "logprobs": None}
            if body.logprobs is not None:
                if body.echo:
                    starts = [sum(len(p) for p in prompt_pieces[:k]) for k in range(len(prompt_pieces))]
                    pieces, lps = prompt_pieces + pieces, prompt_lps + lps
                    offsets = starts + [len(prompt_text) + o for o in offsets]
                choice["logprobs"] = {"tokens": pieces, "token_logprobs": lps, "top_logprobs": None,
                                      "text_offset": offsets}
            choices.append(choice)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": engine.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": sum(len(s.tokens) for s in samples),
                          "total_tokens": len(ids) + sum(len(s.tokens) for s in samples)}}

    return app


def _token_logprob(piece: str, lp: float) -> dict:
    return {"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}


async def _chat_stream(rid, created, model, outs, with_logprobs: bool):
    def chunk(index, delta, reason=None, logprobs=None):
        return "data: " + json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                                      "model": model, "choices": [{"index": index, "delta": delta,
                                                                   "logprobs": logprobs,
                                                                   "finish_reason": reason}]}) + "\n\n"

    for i, (_, pieces, lps, _, reason) in enumerate(outs):
        yield chunk(i, {"role": "assistant", "content": ""})
        for piece, lp in zip(pieces, lps):
            yield chunk(i, {"content": piece},
                        logprobs={"content": [_token_logprob(piece, lp)]} if with_logprobs else None)
        yield chunk(i, {}, reason)
    yield "data: [DONE]\n\n"
