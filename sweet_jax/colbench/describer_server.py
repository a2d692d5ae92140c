"""The SYNTHETIC design domain's simulated human over the OpenAI vision API (`python -m sweet_jax.describer`): a
deterministic describer of screenshot differences (`colbench.synthetic_frontend.describe`), not a model. Imports no
JAX.

It takes what the frontend episode sends the simulator (`colbench.env.FrontendEpisode.simulator_messages`): one
user message whose image parts are the agent's screenshot then the target's, as base64 data URLs, or only the
target's after the "no page yet" note. It reads the looks off the two images (`look_of`) and answers with
`describe`, whatever the temperature, seed or token limit. Malformed requests get a 400 naming the message and part.
With `--domain testbed` it serves the credit-assignment testbed's scripted human instead, on the backend episode's
simulator prompt (`colbench.testbed_domain.reply_to`).

    POST /v1/chat/completions   GET /v1/models   GET /health
"""


import base64
import binascii
import dataclasses
import io
import time
import uuid

from sweet_jax.chat.message_parts import PartError, content_parts
from sweet_jax.cli.app import flag
from sweet_jax.colbench import prompts
from sweet_jax.colbench import synthetic_frontend as design


@dataclasses.dataclass(frozen=True)
class DescriberSettings:
    host: str = flag("127.0.0.1", help="the address to listen on")
    port: int = flag(8000, help="the port to listen on")
    served_model_name: str = flag("design-describer", help="the id /v1/models reports")
    domain: str = flag("design", choices=("design", "testbed"),
                       help="whose simulated human: the design domain's describer, or the credit-assignment "
                            "testbed's scripted human (`colbench.testbed_domain.reply_to`), a text reply")


class RequestError(ValueError):
    """A request the describer cannot answer; the message names the field."""


def _image(url: str, where: str):
    from PIL import Image, UnidentifiedImageError

    head, comma, data = url.partition(",")
    if not (url.startswith("data:image/") and comma and head.endswith(";base64")):
        raise RequestError(f"{where}: expected a base64 data URL of an image (data:image/png;base64,...)")
    try:
        return Image.open(io.BytesIO(base64.b64decode(data, validate=True))).convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as e:
        raise RequestError(f"{where}: not a decodable image ({type(e).__name__})") from None


def reply_to(messages: list) -> str:
    """The describer's reply to a chat request's messages."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list")
    i = len(messages) - 1
    content = messages[i].get("content") if isinstance(messages[i], dict) else None
    if not isinstance(content, list):
        raise RequestError(f"messages.{i}.content: expected the frontend simulator's list of text and image parts")
    images, no_page = [], False
    try:
        parts = content_parts(content, f"messages.{i}.content")
    except PartError as e:
        raise RequestError(str(e)) from None
    for part in parts:
        if part.kind == "image_url":
            images.append(_image(part.value if isinstance(part.value, str) else "", f"{part.field}.image_url"))
        else:
            no_page = no_page or part.value == prompts.FRONTEND_NO_IMAGE
    want = 1 if no_page else 2
    if len(images) != want:
        raise RequestError(f"messages.{i}.content: expected {want} image(s) "
                           f"({'the target' if no_page else 'the agent page, then the target'}), got {len(images)}")
    target = design.look_of(images[-1])
    return design.describe(None if no_page else design.look_of(images[0]), target)


def create_app(model_name: str, reply=reply_to):
    # (no `from __future__ import annotations` in this module: FastAPI reads the handler's `Request` annotation)
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="sweet_jax design describer", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "sweet_jax"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError("the request body: expected a JSON object")
            text = reply(body.get("messages"))
        except (RequestError, ValueError) as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error", "code": 400}},
                                status_code=400)
        n = int(body.get("n") or 1)
        words = len(text.split())
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name,
                "choices": [{"index": k, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                             "logprobs": None} for k in range(n)],
                "usage": {"prompt_tokens": 0, "completion_tokens": words * n, "total_tokens": words * n}}

    return app


def serve(s: DescriberSettings) -> None:
    import uvicorn

    reply = reply_to
    if s.domain == "testbed":
        from sweet_jax.colbench.testbed_domain import reply_to as reply
    uvicorn.run(create_app(s.served_model_name, reply), host=s.host, port=s.port, log_level="warning")
