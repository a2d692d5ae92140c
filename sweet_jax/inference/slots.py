"""Continuous batching on the device: a fixed set of decode slots, each holding one sample's KV-cache row, and the
jitted programs that fill, run and free them (`SlotPrograms`). `inference.scheduler` decides what goes where.

    progs = slot_programs(cfg, placement, slots=64, context=8192)   # compiled once per shape, cached
    state = progs.new_state()
    state = progs.admit(params, state, prompt_ids, slots=[3, 4], seed=7, sampling=SamplingParams(...))
    state, tokens, logprobs = progs.decode(params, state, steps=16, window=1024)   # [slots, 16] each, -1 = none
    state = progs.release(state, [3])

- A slot's row of the cache holds its prompt at positions 0 .. len - 1 and its generated tokens after it; its RoPE
  positions are its cache positions. Every row writes at its own length, so rows of any lengths decode together, and
  a request joins between two decode segments without waiting for the others.
- `admit` prefills one prompt in `chunk`-token chunks straight into one slot's row (a chunk's program depends on
  its position alone) and copies the row into the slots of its other samples: the samples share one prefill. With
  `reuse`, whole chunks another slot's row already holds for the same tokens are taken over or copied, and only
  the rest is prefilled, with the same results (prefix caching, driven by `inference.scheduler`). Sample j draws
  from fold_in(key(seed), j) and its step i from fold_in(that, i), so a sample's tokens depend on its prompt,
  settings and seed only: not on the slot it lands in, nor on what else is decoding.
- `decode` runs `steps` decode steps for every slot (idle slots compute on a dummy token and write nothing that is
  read). Attention reads the first `window` cache positions only (a static bound on the active lengths, chosen by the
  scheduler), so a short batch does not pay for the whole context.
- Every program is jitted with explicit shardings for its inputs and outputs (weights by the rules table, the state's
  rows over `data` and its KV heads over `tensor`), and the state is donated: the cache is updated in place.
- A prompt with images (a vision-language model's, `inference.images.PromptImages`) is prefilled in one program,
  the vision tower included, at its M-RoPE positions; its generated tokens then take their cache positions plus the
  prompt's M-RoPE shift (the slot's `shift`; 0 for text), as HF's generation does.
- A slot ends at its first stop token (kept in its tokens, as vLLM does with EOS), after its max_tokens, or when its
  row of the cache is full.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax import models
from sweet_jax.models import kernel_choice, qwen2_vl
from sweet_jax.inference.placement import Placement
from sweet_jax.inference.sampling import MAX_STOP_TOKENS, SamplingParams, sample_logits


def lm_logits(params, cfg, hidden):
    """Next-token logits [B, V] (float32) from final hidden states [B, D]."""
    w = models.lm_head_weight(params, cfg).astype(hidden.dtype)
    return jnp.einsum("bd,dv->bv", hidden, w, preferred_element_type=jnp.float32)


def _state_names(cfg, paged: bool = False, kernel: bool = False) -> dict:
    row, rows2 = ("batch",), ("batch", None)
    return {"cache": models.cache_logical_axes(cfg, paged, kernel), "length": row, "logits": rows2, "key": rows2,
            "count": row, "limit": row, "temperature": row, "top_p": row, "top_k": row, "stop": rows2, "active": row,
            "shift": row}


class SlotPrograms:
    """The programs of one (placed model config, mesh, slot count, context) shape; see the module docstring. Use
    `slot_programs`, which caches them: jit compiles each program once per static shape."""

    def __init__(self, cfg, placement: Placement, slots: int, context: int, chunk: int = 256,
                 page_size: int | None = None, pages: int | None = None, paged_kernel: str = "auto"):
        if slots % placement.data:
            raise ValueError(f"{slots} decode slots do not split over data={placement.data}")
        if chunk < 1:
            raise ValueError(f"the prefill chunk must be >= 1 token, got {chunk}")
        self.cfg, self.placement, self.slots, self.context = cfg, placement, slots, context
        self.chunk = min(chunk, 1 << (context - 1).bit_length())  # prefill chunk: prompts go in at most this long
        self.positions = -(-context // self.chunk) * self.chunk  # cache positions: whole chunks
        self.page_size = page_size
        if page_size is not None:
            if placement.data != 1:
                raise ValueError(f"a paged KV cache serves at data=1 (its pages are one pool); the mesh has "
                                 f"data={placement.data}: shard over tensor, or leave page_size unset")
            if page_size < 1 or self.chunk % page_size:
                raise ValueError(f"page_size {page_size} must divide the prefill chunk ({self.chunk} tokens)")
            self.max_pages = self.positions // page_size
            self.pages = pages or slots * self.max_pages + 1  # default: the dense cache's memory, and scratch
        # decoding on the paged kernel (`models.paged_attention`, its pools' layout): "auto" where the device has one
        # that fits these pages, "on" (or an error naming the device), "off"
        self.paged_decode = (kernel_choice.paged_decode(paged_kernel, page_size, self.max_pages, cfg.head_dim)
                             if self.paged else kernel_choice.PagedDecode(None, note="a dense cache"))
        self.page_kernel = self.paged_decode.kernel is not None
        abstract_state = jax.eval_shape(self._zeros)
        self.state_shardings = placement.shardings(_state_names(cfg, self.paged, self.page_kernel), abstract_state)
        abstract_params = jax.eval_shape(models.unstack_layers, models.abstract_params(cfg))
        self.param_shardings = placement.param_shardings(abstract_params, cfg)
        self._replicated = placement.sharding((), ())
        self._new = jax.jit(self._zeros, out_shardings=self.state_shardings)
        self._prefill: dict = {}
        self._copy: dict = {}
        self._start: dict = {}
        self._image_prefill: dict = {}
        self._decode: dict = {}
        self._set_pages = jax.jit(self._set_pages_fn, donate_argnums=0,
                                  in_shardings=(self.state_shardings, self._replicated, self._replicated),
                                  out_shardings=self.state_shardings)
        self._release = jax.jit(self._release_fn, donate_argnums=0,
                                in_shardings=(self.state_shardings, self._replicated),
                                out_shardings=self.state_shardings)

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    # ------------------------------------------------------------------ state
    def _zeros(self) -> dict:
        b, cfg = self.slots, self.cfg
        f32, i32 = jnp.float32, jnp.int32
        cache = (models.init_paged_cache(cfg, b, self.pages, self.page_size, self.positions, kernel=self.page_kernel)
                 if self.paged else models.init_cache(cfg, b, self.positions))
        return {"cache": cache, "length": jnp.zeros(b, i32),
                "logits": jnp.zeros((b, cfg.vocab_size), f32), "key": jnp.zeros((b, 2), jnp.uint32),
                "count": jnp.zeros(b, i32), "limit": jnp.zeros(b, i32), "temperature": jnp.zeros(b, f32),
                "top_p": jnp.ones(b, f32), "top_k": jnp.zeros(b, i32),
                "stop": jnp.full((b, MAX_STOP_TOKENS), -1, i32), "active": jnp.zeros(b, bool),
                "shift": jnp.zeros(b, i32)}

    def new_state(self) -> dict:
        """Every slot free, on the mesh."""
        with self.placement.active():
            return self._new()

    # ------------------------------------------------------------------ admit
    def chunk_window(self, start: int) -> int:
        """The attention window of the prefill chunk at `start`: a function of `start` alone, so that a chunk's keys
        and values come out the same whichever request computed them."""
        return min(self.positions, max(self.chunk, 1 << (start + self.chunk - 1).bit_length()))

    def part_size(self, n: int) -> int:
        """The padded size of a prompt's last, partial chunk of n tokens: a quarter, a half or a whole chunk (it is
        never reused, so its size is free; the whole chunks before it are always `chunk` long)."""
        return next(size for size in (self.chunk // 4, self.chunk // 2, self.chunk) if n <= size)

    def copy_bucket(self, length: int) -> int:
        """The cache positions a row copy moves to carry `length` of them (a power of two of chunks)."""
        chunks = -(-length // self.chunk)
        return min(self.positions, self.chunk << max(0, (chunks - 1).bit_length()))

    def admit(self, params, state: dict, prompt: list[int], slots: list[int], seed: int,
              sampling: SamplingParams, first_sample: int = 0, reuse: tuple[int, int] | None = None,
              images=None, pages=None) -> dict:
        """Prefill `prompt` once into the free `slots` (one per sample), with its settings and seed. The samples are
        numbered from `first_sample` (a request split over several admissions draws as if it were one).

        `reuse` = (slot, m): the first m positions of that slot's row (any slot's, a whole number of chunks of an
        earlier prompt equal to this one's first m tokens) are this prompt's; only the rest is prefilled. The
        chunks are computed by one program per chunk position whatever came before, so reusing gives the same
        cache, logits and samples as prefilling it all. `images` (`inference.images.PromptImages`): the prompt's
        images, prefilled with it in one program (never reused).

        A paged cache takes `pages` (`inference.pages.PageRows`): the slots' page table rows, which already name
        the reused prefix's pages (nothing is copied for it), and the partial page each further sample gets a copy
        of."""
        if self.paged != (pages is not None):
            raise ValueError("a paged cache's admission takes its page rows (inference.pages.PagePool.admit); a "
                             "dense cache's takes none")
        if not prompt or len(prompt) >= self.context:
            raise ValueError(f"a prompt of {len(prompt)} tokens does not fit a {self.context}-position cache")
        if len(sampling.stop_tokens) > MAX_STOP_TOKENS:
            raise ValueError(f"at most {MAX_STOP_TOKENS} stop tokens, got {len(sampling.stop_tokens)}")
        src, m = reuse if reuse is not None else (slots[0], 0)
        if m % self.chunk or not 0 <= m < len(prompt):
            raise ValueError(f"a reused prefix is a whole number of {self.chunk}-token chunks shorter than the prompt,"
                             f" got {m} of {len(prompt)}")
        if images is not None and m:
            raise ValueError("a prompt with images is prefilled whole: it reuses no cached prefix")
        target = slots[0]
        stop = np.full(MAX_STOP_TOKENS, -1, np.int32)
        stop[:len(sampling.stop_tokens)] = sampling.stop_tokens
        with self.placement.active():
            if pages is not None:
                state = self._set_pages(state, np.asarray(slots, np.int32), pages.rows)
            if images is not None:
                state = self._admit_images(params, state, prompt, target, images)
            elif m and src != target and pages is None:
                state = self.copy_program(self.copy_bucket(m), 1)(state, np.int32(src), np.asarray([target], np.int32))
            for c0 in range(m, len(prompt), self.chunk) if images is None else ():
                part = prompt[c0:c0 + self.chunk]
                tokens = np.zeros(self.part_size(len(part)), np.int32)
                tokens[:len(part)] = part
                state = self.prefill_program(self.chunk_window(c0), len(tokens))(
                    params, state, tokens, np.int32(c0), np.int32(len(prompt)), np.int32(target))
            fn = self.start_program(self.copy_bucket(len(prompt)), len(slots))
            # what the other samples' rows copy: a dense row's first positions, or a paged row's partial page
            copy = (np.int32(target), np.int32(0)) if pages is None else (np.int32(pages.copy_src), pages.copy_dst)
            return fn(state, *copy, np.asarray(slots, np.int32), np.int32(len(prompt)),
                      np.uint32(seed & 0xFFFFFFFF), np.float32(sampling.temperature), np.float32(sampling.top_p),
                      np.int32(sampling.top_k), np.int32(sampling.max_tokens), stop, np.int32(first_sample),
                      np.int32(0 if images is None else images.shift))

    def _admit_images(self, params, state, prompt, slot, images) -> dict:
        size = min(self.positions, max(self.chunk, 1 << (len(prompt) - 1).bit_length()))
        merge = self.cfg.vision.spatial_merge_size ** 2
        patches = max(merge, 1 << (len(images.pixels) - 1).bit_length())
        tokens = np.zeros(size, np.int32)
        tokens[:len(prompt)] = prompt
        positions = np.zeros((3, size), np.int32)
        positions[:, :len(prompt)] = images.positions
        batch = qwen2_vl.image_batch(images.pixels, images.grid_thw, self.cfg.vision.spatial_merge_size,
                                     pad_to=patches)._replace(grid_thw=None)
        return self.image_prefill_program(size, patches)(params, state, tokens, positions, batch,
                                                         np.int32(len(prompt)), np.int32(slot))

    def _jit(self, table: dict, key, fn, n_args: int, params: bool = False):
        program = table.get(key)
        if program is None:
            head = (self.param_shardings, self.state_shardings) if params else (self.state_shardings,)
            program = table[key] = jax.jit(fn, donate_argnums=int(params), out_shardings=self.state_shardings,
                                           in_shardings=head + (self._replicated,) * n_args)
        return program

    def image_prefill_program(self, size: int, patches: int):
        """A prompt with images into a slot's row, whole: (params, state, tokens [size], M-RoPE positions [3, size],
        images (`qwen2_vl.Images` of `patches` patches, without grids), prompt length, slot) -> state."""
        return self._jit(self._image_prefill, (size, patches), self._image_prefill_fn, 5, params=True)

    def prefill_program(self, window: int, size: int):
        """One chunk of a prompt into a slot's row: (params, state, tokens [size], start, prompt length, slot) ->
        state, with the row's cache written at start .. start + size - 1 and its next-token logits set (the
        prompt's last chunk sets the ones that stay)."""
        return self._jit(self._prefill, (window, size), functools.partial(self._prefill_fn, window=window), 4,
                         params=True)

    def copy_program(self, positions: int, n: int):
        """(state, src, dsts [n]) -> state with the first `positions` of src's cache row copied into the n rows."""
        return self._jit(self._copy, (positions, n), functools.partial(self._copy_fn, positions=positions), 2)

    def start_program(self, positions: int, n: int):
        """(state, src, dst_pages, slots [n], length, seed, temperature, top_p, top_k, max_tokens, stop,
        first_sample, shift) -> state: slots[0] has the prefilled row; the n start sampling, their positions shifted
        by `shift`, with its logits. A dense cache copies the first `positions` of row src (= slots[0]) into the
        other slots (dst_pages unused); a paged one copies page src into the pages dst_pages [n - 1]."""
        return self._jit(self._start, (positions, n), functools.partial(self._start_fn, positions=positions), 12)

    def _prefill_fn(self, params, state, tokens, start, length, slot, *, window, mrope=None, images=None):
        cfg, c = self.cfg, tokens.shape[0]
        positions = start + jnp.arange(c, dtype=jnp.int32)
        seg = (positions < length).astype(jnp.int32)[None]
        rope = positions[None] if mrope is None else mrope[:, None]
        hidden, cache = models.forward_cached(params, cfg, tokens[None], rope, seg, state["cache"], start,
                                              window=window, row=slot, images=images)
        last = jnp.clip(length - 1 - start, 0, c - 1)
        logits = lm_logits(params, cfg, jax.lax.dynamic_index_in_dim(hidden[0], last, keepdims=True))
        logits = jax.lax.dynamic_update_index_in_dim(state["logits"], logits, slot, 0)
        return {**state, "cache": cache, "logits": logits}

    def _image_prefill_fn(self, params, state, tokens, positions, images, length, slot):
        return self._prefill_fn(params, state, tokens, jnp.int32(0), length, slot, window=tokens.shape[0],
                                mrope=positions, images=images)

    def _copy_rows(self, cache, src, dsts, positions):
        def move(full, names):  # the first `positions` cache positions of row src into rows dsts
            axis = names.index("cache_seq")
            part = jax.lax.slice_in_dim(jax.lax.dynamic_index_in_dim(full, src, 0, keepdims=True), 0, positions,
                                        axis=axis)
            part = jnp.broadcast_to(part, (dsts.shape[0], *part.shape[1:]))
            index = (dsts,) + (slice(None),) * (axis - 1) + (slice(0, positions),)
            return full.at[index].set(part)
        return jax.tree.map(move, cache, models.cache_logical_axes(self.cfg))  # arrays, with their names

    def _copy_fn(self, state, src, dsts, *, positions):
        return {**state, "cache": self._copy_rows(state["cache"], src, dsts, positions)}

    def _copy_pages(self, cache, src, dsts):
        def move(pool, axis=0):  # page src of a pool (pages on `axis`) into pages dsts
            pool = jnp.moveaxis(pool, axis, 0)
            page = jax.lax.dynamic_index_in_dim(pool, src, 0, keepdims=True)
            return jnp.moveaxis(pool.at[dsts].set(jnp.broadcast_to(page, (dsts.shape[0], *page.shape[1:]))), 0, axis)
        axis = 1 if self.page_kernel else 0
        pools = {name: tuple(move(p, axis) for p in cache[name]) for name in cache if name not in ("segment_ids",
                                                                                                   "pages")}
        return {**cache, **pools, "segment_ids": move(cache["segment_ids"])}

    def _set_pages_fn(self, state, slots, rows):
        return {**state, "cache": {**state["cache"], "pages": state["cache"]["pages"].at[slots].set(rows)}}

    def _start_fn(self, state, src, dst_pages, slots, length, seed, temperature, top_p, top_k, limit, stop, first,
                  shift, *, positions):
        n = slots.shape[0]  # slots[0]: the prompt was prefilled there
        if n == 1:
            cache = state["cache"]
        elif self.paged:
            cache = self._copy_pages(state["cache"], src, dst_pages)
        else:
            cache = self._copy_rows(state["cache"], src, slots[1:], positions)
        src = slots[0]
        keys = jax.vmap(lambda j: jax.random.key_data(jax.random.fold_in(jax.random.key(seed), j)))(
            first + jnp.arange(n))
        fill = lambda name, value: state[name].at[slots].set(value)  # noqa: E731
        logits = jax.lax.dynamic_index_in_dim(state["logits"], src, 0, keepdims=True)
        return {"cache": cache, "length": fill("length", length), "key": fill("key", keys),
                "logits": fill("logits", jnp.broadcast_to(logits, (n, logits.shape[-1]))),
                "count": fill("count", 0), "limit": fill("limit", limit),
                "temperature": fill("temperature", temperature),
                "top_p": fill("top_p", top_p), "top_k": fill("top_k", top_k),
                "stop": fill("stop", jnp.broadcast_to(stop, (n, stop.shape[0]))), "active": fill("active", True),
                "shift": fill("shift", shift)}

    # ------------------------------------------------------------------ decode
    def decode(self, params, state: dict, steps: int, window: int | None = None):
        """Up to `steps` decode steps for every active slot (fewer if all end) -> (state, tokens [slots, steps],
        logprobs [slots, steps]); a slot's new tokens are its entries != -1, in order."""
        window = self.context if window is None else min(window, self.context)
        with self.placement.active():
            return self.decode_program(steps, window)(params, state)

    def decode_program(self, steps: int, window: int):
        """The jitted decode segment: (params, state) -> (state, tokens [slots, steps], logprobs [slots, steps])."""
        fn = self._decode.get((steps, window))
        if fn is None:
            out = self.placement.sharding(("batch", None), (self.slots, steps))
            fn = self._decode[(steps, window)] = jax.jit(
                functools.partial(self._decode_fn, steps=steps, window=window), donate_argnums=1,
                in_shardings=(self.param_shardings, self.state_shardings),
                out_shardings=(self.state_shardings, out, out))
        return fn

    def cache_copies(self, params, state, steps: int = 4, window: int | None = None, *, donate: bool = True) -> list:
        """The instructions of the compiled decode program (for these params and state, concrete or abstract) that
        copy a whole layer of the KV cache: empty when every step writes the cache in place. `donate=False`
        compiles the program without donating the state, which must copy it (a check of the check)."""
        window = self.context if window is None else min(window, self.context)
        program = self.decode_program(steps, window)
        if not donate:
            program = jax.jit(functools.partial(self._decode_fn, steps=steps, window=window),
                              in_shardings=(self.param_shardings, self.state_shardings))
        with self.placement.active():
            text = program.lower(params, state).compile().as_text()
        shapes = {f"[{','.join(map(str, x.shape))}]" for x in jax.tree.leaves(state["cache"]) if x.ndim == 4}
        return [line.strip() for line in text.splitlines()
                if re.search(r"= \w+(\[[\d,]*\])\S* copy(?:-start)?\(", line)
                and re.search(r"= \w+(\[[\d,]*\])", line).group(1) in shapes]

    def _decode_fn(self, params, state, *, steps: int, window: int):
        cfg, b, context = self.cfg, self.slots, self.context

        def step(carry):
            st, out, lps, s = carry
            act = st["active"]
            keys = jax.vmap(lambda k, i: jax.random.fold_in(jax.random.wrap_key_data(k), i))(st["key"], st["count"])
            logits = st["logits"]
            tok = sample_logits(logits, keys, st["temperature"], st["top_p"], st["top_k"]).astype(jnp.int32)
            lp = jnp.take_along_axis(logits, tok[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(logits, axis=-1)
            hidden, cache = models.forward_cached(params, cfg, tok[:, None], (st["length"] + st["shift"])[:, None],
                                                  act[:, None].astype(jnp.int32), st["cache"], st["length"],
                                                  window=window)
            count, length = st["count"] + act, st["length"] + act
            done = act & (jnp.any(tok[:, None] == st["stop"], axis=-1) | (count >= st["limit"]) |
                          (length >= context))
            st = {**st, "cache": cache, "logits": lm_logits(params, cfg, hidden[:, 0]), "count": count,
                  "length": length, "active": act & ~done}
            return st, out.at[:, s].set(jnp.where(act, tok, -1)), lps.at[:, s].set(jnp.where(act, lp, 0.0)), s + 1

        out = jnp.full((b, steps), -1, jnp.int32)
        st, out, lps, _ = jax.lax.while_loop(lambda c: (c[3] < steps) & jnp.any(c[0]["active"]), step,
                                             (state, out, jnp.zeros((b, steps), jnp.float32), jnp.int32(0)))
        return st, out, lps

    # ------------------------------------------------------------------ release
    def release(self, state: dict, slots: list[int]) -> dict:
        """Free `slots` now (a cancelled request): they stop decoding."""
        mask = np.zeros(self.slots, bool)
        mask[list(slots)] = True
        with self.placement.active():
            return self._release(state, mask)

    @staticmethod
    def _release_fn(state, mask):
        return {**state, "active": state["active"] & ~mask}


@functools.lru_cache(maxsize=32)
def slot_programs(cfg, placement: Placement, slots: int, context: int, chunk: int = 256,
                  page_size: int | None = None, pages: int | None = None,
                  paged_kernel: str = "auto") -> SlotPrograms:
    """The (cached) programs for a placed model config (`Placement.prepare`), a state shape, a prefill chunk and
    (for a paged KV cache) its page size, page count and decode kernel setting ("auto", "on", "off")."""
    return SlotPrograms(cfg, placement, slots, context, chunk, page_size, pages, paged_kernel)
