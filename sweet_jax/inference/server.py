"""Serving a model over the OpenAI API (`python -m sweet_jax.serve`): load it (an HF directory, a Hub id, or a
training run's latest Orbax checkpoint) straight onto the mesh of `--mesh` (weights in bf16 on accelerators), build the
continuously batching `Engine`, and run the `api` app under uvicorn. `ServeSettings` is the command's flags."""

from __future__ import annotations

import dataclasses
import logging

from sweet_jax.cli.app import flag
from sweet_jax.files.hub import display_name

log = logging.getLogger("sweet_jax.serve")


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    model: str = flag(help="an HF checkpoint directory, a Hub id (owner/name[@revision]) or a sweet_jax.train run "
                           "directory", required=True)
    adapter: str | None = flag(None, help="a PEFT LoRA adapter directory on top of --model (an HF directory), "
                                          "merged into its weights at load")
    tokenizer: str | None = flag(None, help="tokenizer directory (default: the model's, else the bundled one)")
    chat_format: str | None = flag(None, help="how /v1/chat/completions writes the conversation: 'template' (the "
                                              "tokenizer's own chat template), 'llama3' or 'chatml' (default: the "
                                              "tokenizer's template when it has one, as vLLM does, else the model "
                                              "family's format)")
    served_model_name: str | None = flag(None, help="the id /v1/models reports (default: the directory's name)")
    host: str = flag("127.0.0.1", help="the address to listen on")
    port: int = flag(8000, help="the port to listen on")
    dtype: str | None = flag(None, choices=("float32", "bfloat16"),
                             help="compute dtype (default: bfloat16 on an accelerator, float32 on CPU)")
    mesh: str | None = flag(None, help="device mesh, e.g. data=2,tensor=4 (the `plan` syntax); default one device")
    max_model_len: int = flag(4096, help="prompt + generated tokens of one sample, at most (its KV-cache row)")
    max_batch: int = flag(16, help="decode slots: samples decoding at once (KV cache = slots x max_model_len)")
    stream_segment: int = flag(8, help="decode steps between scheduling rounds (new requests join, streams get "
                                       "their next chunk)")
    prefill_chunk: int = flag(256, help="prompts are prefilled in chunks of this many tokens; whole chunks of earlier "
                                        "prompts are reused (prefix caching)")
    page_size: int | None = flag(None, help="a paged KV cache of pages this many tokens long (must divide "
                                            "--prefill-chunk); default: a dense cache, a row per slot")
    kv_pages: int | None = flag(None, help="with --page-size: pages in the cache, shared by all slots (default: as "
                                           "many as the dense cache would hold); a request waits for the pages its "
                                           "prompt and max_tokens can fill")
    paged_kernel: str = flag("auto", choices=("auto", "on", "off"),
                             help="with --page-size: decode on the paged attention kernel, which reads each row's live "
                                  "pages only ('auto': where the device has one that fits the pages, the Triton "
                                  "kernel on NVIDIA GPUs from sm80 or Mosaic on TPUs; 'on': that kernel or an error "
                                  "naming the device; 'off': gather the pages and attend densely)")
    max_image_pixels: int | None = flag(None, help="a vision-language model's images are resized to at most this "
                                                   "many pixels (default: its preprocessor_config.json's max_pixels)")


def serve(s: ServeSettings) -> None:
    """Load the model and serve it until the process is stopped."""
    import uvicorn

    from sweet_jax import models
    from sweet_jax.inference.api import create_app
    from sweet_jax.inference.engine import Engine
    from sweet_jax.inference.placement import Placement, compute_dtype
    from sweet_jax.models.qwen2_vl_images import ImageSettings

    placement = Placement.build(s.mesh)
    loaded = models.load_model(s.model, compute_dtype(s.dtype), inference_layout=True,
                               shardings=placement.stacked_shardings, adapter=s.adapter)
    engine = Engine(loaded.params, loaded.cfg, loaded.tokenizer(s.tokenizer), chat_format=s.chat_format,
                    model_name=s.served_model_name or display_name(s.model),
                    max_batch=s.max_batch, max_model_len=min(s.max_model_len, loaded.cfg.max_position_embeddings),
                    stream_segment=s.stream_segment, prefill_chunk=s.prefill_chunk, page_size=s.page_size,
                    kv_pages=s.kv_pages, paged_kernel=s.paged_kernel, placement=placement,
                    image_settings=ImageSettings.of_model(s.model, max_pixels=s.max_image_pixels))
    del loaded  # the engine holds the params
    log.info("serving %s on http://%s:%d/v1 (%s, %d slots x %d tokens)", s.model, s.host, s.port,
             placement.describe(), engine.max_batch, engine.max_model_len)
    uvicorn.run(create_app(engine), host=s.host, port=s.port, log_level="warning")
