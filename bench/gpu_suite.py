"""One accelerator suite: the train step and the decode step against their targets and against HF + torch, side by
side on the same device, in at most 8 minutes on one H200.

    python bench/gpu_suite.py --json suite.json            # on a GPU host (the device image: carry ml_collections)
    python bench/gpu_suite.py --smoke                      # every row at tiny shapes, on CPU (CI runs this)
    python bench/gpu_suite.py --sections attention,critic  # some sections only

Sections, in the order they run (each in a child process of its own, so a crash or an out-of-memory loses that
section's remaining rows only; a row that fails says why and the next one runs):
- versions: the device, its compute capability, the driver, cuDNN, jax, jaxlib and the commit, printed first.
- attention: fused attention fwd+bwd at [2, 4,096], 32/8 heads x 64, for whole rows (is_causal alone), one segment
  plus padding (sequence lengths), 4 packed segments (cuDNN's offsets from Hopper, the Triton flash kernel before)
  and the explicit mask; and decode attention alone (8B shapes, batch 64, 2,048 keys).
- pairs: the jobs' own rows, prefix-shared pairs [history | chosen | rejected] at 8B's heads (32/8 x 128): the
  critic's (1,584 | 960 | 960 in 4,096) and the actor's (6,976 | 192 | 192 in 8,192), the tiny pipeline's pair
  lengths (critic 99 | 60 | 60 of max_len 512, actor 218 | 6 | 6 of 512) scaled to the 8B recipes' max_len; on the
  kernel the device gets (one row per branch) and on the explicit mask (before), fwd+bwd.
- critic: critic train-step MFU (`bench/mfu.py`), 1B and 3B at 2 x 4,096, and 1B with 4 packed documents per row;
  an attention implementation the device cannot run falls back to the next, and the row says so.
- split: the 1B step's forward loss, value_and_grad and full step: forward, backward and optimiser times.
- decode: decode MBU (`bench/decode_mbu.py`) for 1B and 8B at batch 1/16/64 and prompts 128/512/2,048, the two
  target rows also on the paged KV cache (on a GPU: JAX's Pallas paged-attention kernel, reading each row's live
  pages only), and the compiled 8B decode steps checked for whole-cache copies (`SlotPrograms.cache_copies`).
- peer: HF `LlamaForCausalLM` + torch fused AdamW (autocast bf16, SDPA) on the critic shapes, and HF generate()
  on the decode shapes.
Every row that computes attention checks its output against the reference attention (in f32, matmuls at full
precision: TF32 would not do) and fails beyond its stated tolerance. The summary compares each target figure with
its target (`bench/targets.py`, the one place) and each sweet_jax row with its peer row; the run exits 1 when a row
failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import selectors
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import targets  # noqa: E402  (bench/targets.py: the targets, in one place)

SECTIONS = ("versions", "attention", "pairs", "critic", "split", "decode", "peer")
# seconds each section may take on the real shapes (the whole suite: 8 minutes); --smoke: a minute each at most
SECTION_S = {"versions": 10, "attention": 45, "pairs": 40, "critic": 100, "split": 55, "decode": 140, "peer": 90}
# How far a row's output may be from the reference attention's: f32 inputs (smoke), and bf16 inputs against the f32
# reference of the same bf16 values (outputs of magnitude up to ~3: about two bf16 steps)
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


# ------------------------------------------------------------------------------------------------- versions
def version_rows(smoke: bool):
    def run():
        import platform
        import subprocess

        import jax
        import jaxlib

        from sweet_jax.parallel import devices

        device = devices.current()
        d = jax.devices()[0]
        out = {"device": device.kind, "platform": device.platform, "devices": jax.device_count(),
               "compute_capability": "sm%d%d" % device.compute_capability if device.compute_capability else None,
               "cudnn": devices.cudnn_text(device.cudnn_version) if device.cudnn_version else None,
               "jax": jax.__version__, "jaxlib": jaxlib.__version__, "python": platform.python_version(),
               "runtime": getattr(d.client, "platform_version", None),
               "matmul_precision": jax.config.jax_default_matmul_precision or "default (TF32 for f32 on GPUs)"}
        try:
            out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.split("\n")[0] or None
        except (OSError, subprocess.SubprocessError):
            out["driver"] = None
        try:
            out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=HERE, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            out["commit"] = None
        return out

    yield "versions", run


def reference_check(got, ref, real, dtype) -> dict:
    """The largest difference from the reference over real tokens, and the tolerance it is held to."""
    import jax.numpy as jnp

    diff = float(jnp.max(jnp.where(real, jnp.abs(got.astype(jnp.float32) - ref), 0)))
    if diff != diff:  # NaN
        diff = float("inf")
    return {"max_abs_diff_vs_reference": diff, "tolerance": TOLERANCE[jnp.dtype(dtype).name]}


def reference_attention(q, k, v, seg, branch=None):
    """The reference attention in f32 with full-precision matmuls (GPUs multiply f32 as TF32 by default)."""
    import jax
    import jax.numpy as jnp

    attn = _attention()
    with jax.default_matmul_precision("highest"):
        return jax.jit(lambda q, k, v: attn.reference_attention(
            q, k, v, seg, seg, q_branch_ids=branch, kv_branch_ids=branch))(*(x.astype(jnp.float32) for x in (q, k, v)))


# ------------------------------------------------------------------------------------------------- rows
def _median_s(fn, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _attention():
    """sweet_jax.models.attention, the module (the package's `attention` is the function), imported when a row runs."""
    from importlib import import_module

    return import_module("sweet_jax.models.attention")


LAYOUTS = ("whole rows (is_causal)", "one segment + padding (lengths)", "4 packed segments (offsets)")


def _impl(smoke: bool) -> str:
    """The attention setting of the attention rows: the device's own choice; on a CPU smoke run, xla's kernel
    through the same segment dispatch (the reference takes no layouts)."""
    import jax

    return "xla" if smoke and jax.default_backend() == "cpu" else "auto"


def _path_label(seg, impl: str, t: int, h: int) -> str:
    """Which kernel the segment dispatch gives this batch on this device, e.g. 'packed: triton'."""
    from sweet_jax.parallel import devices

    attn = _attention()
    path = int(attn.fused_path(attn.segment_layout(seg)))
    kernels = attn.segment_kernels(impl, devices.current(), t, h)
    return {attn.WHOLE_ROWS: "whole rows", attn.ONE_SEGMENT: "one segment",
            attn.PACKED: f"packed: {kernels.packed or 'mask'}", attn.MASKED: f"other: {kernels.general or 'mask'}"}[path]


def attention_rows(smoke: bool):
    """The attention section's rows. Nothing runs (no jax, no device memory) until a row is called: the parent
    process lists a failed section's rows by name."""
    b, t, n, k, h = (2, 128, 4, 2, 16) if smoke else (2, 4096, 32, 8, 64)

    @functools.cache
    def inputs():
        import jax
        import jax.numpy as jnp

        from sweet_jax.models import kernel_choice

        dtype = jnp.float32 if smoke else jnp.bfloat16
        keys = jax.random.split(jax.random.key(0), 3)
        qkv = (jax.random.normal(keys[0], (b, t, n, h), dtype),
               *(jax.random.normal(x, (b, t, k, h), dtype) for x in keys[1:]))
        pad = t // 10
        segments = dict(zip(LAYOUTS, (jnp.ones((b, t), jnp.int32),
                                      jnp.broadcast_to((jnp.arange(t) < t - pad).astype(jnp.int32), (b, t)),
                                      jnp.broadcast_to(jnp.arange(t) // (t // 4) + 1, (b, t)).astype(jnp.int32))))
        impl = kernel_choice.attention_impl(_impl(smoke), dtype, (t, t), h)
        return qkv, segments, impl

    def layout_row(name):
        import jax
        import jax.numpy as jnp

        attn = _attention()
        (q, kk, v), segments, impl = inputs()
        seg = segments[name]
        grad = jax.jit(jax.grad(lambda q, kk, v: attn.attention(q, kk, v, seg, seg, impl=impl).astype(
            jnp.float32).sum(), (0, 1, 2)))
        ms = 1e3 * _median_s(lambda: grad(q, kk, v), 3 if smoke else 10)
        got = jax.jit(lambda q, kk, v: attn.attention(q, kk, v, seg, seg, impl=impl))(q, kk, v)
        return {"ms": ms, **reference_check(got, reference_attention(q, kk, v, seg), (seg > 0)[:, :, None, None],
                                            q.dtype),
                "path": _path_label(seg, impl, t, h), "impl": impl}

    for name in LAYOUTS:
        yield f"attention fwd+bwd {name}", functools.partial(layout_row, name)

    def masked():
        import jax
        import jax.numpy as jnp

        attn = _attention()
        (q, kk, v), segments, impl = inputs()
        seg = segments[LAYOUTS[2]]
        if impl not in ("xla", "cudnn"):
            return {"ms": None, "note": f"no fused kernel here ({impl})"}
        fn = lambda q, kk, v: attn._masked_fused(q, kk, v, seg, seg, impl=impl, scale=h ** -0.5)  # noqa: E731
        grad = jax.jit(jax.grad(lambda *x: fn(*x).astype(jnp.float32).sum(), (0, 1, 2)))
        ms = 1e3 * _median_s(lambda: grad(q, kk, v), 3 if smoke else 10)
        return {"ms": ms, "impl": impl, **reference_check(jax.jit(fn)(q, kk, v), reference_attention(q, kk, v, seg),
                                                          (seg > 0)[:, :, None, None], q.dtype)}

    yield "attention fwd+bwd 4 packed segments, explicit mask (before)", masked

    def decode_attention():
        import jax
        import jax.numpy as jnp

        attn = _attention()
        dtype = jnp.float32 if smoke else jnp.bfloat16
        db, dk, dn, dh, ds = (2, 2, 4, 16, 128) if smoke else (64, 8, 32, 128, 2048)
        dkeys = jax.random.split(jax.random.key(1), 3)
        dq = jax.random.normal(dkeys[0], (db, 1, dn, dh), dtype)
        kc = jax.random.normal(dkeys[1], (db, dk, dh, ds), dtype)
        vc = jax.random.normal(dkeys[2], (db, dk, ds, dh), dtype)
        seg = jnp.ones((db, ds), jnp.int32)
        fn = jax.jit(lambda q, kc, vc, off: attn.cached_attention(q, kc, vc, jnp.ones((db, 1), jnp.int32), seg,
                                                                   q_offset=off))
        off = jnp.full((db,), ds - 1, jnp.int32)
        s = _median_s(lambda: fn(dq, kc, vc, off), 5 if smoke else 50)
        nbytes = 2 * kc.size * kc.dtype.itemsize
        return {"us": 1e6 * s, "gbs": nbytes / s / 1e9, "shape": [db, dk, dn, dh, ds]}

    yield "decode attention alone (8B shapes, batch 64, 2048 keys)", decode_attention


# (history, chosen, rejected, row): the tiny pipeline's pair lengths scaled to the 8B recipes' max_len (the critic
# 99 | 60 | 60 of 512 -> 8,192, the actor 218 | 6 | 6 of 512 -> 16,384); the rows are the trainer's buckets
PAIR_SHAPES = {"critic": (1584, 960, 960, 4096), "actor": (6976, 192, 192, 8192)}


def pair_rows(smoke: bool):
    """The jobs' own prefix-shared pair rows: on the device's kernel (one row per branch) and on the explicit mask."""
    n, k, h = (4, 2, 16) if smoke else (32, 8, 128)

    def build(job):
        import jax
        import jax.numpy as jnp
        import numpy as np

        hist, chosen, rejected, t = PAIR_SHAPES[job]
        if smoke:
            hist, chosen, rejected, t = hist // 32, chosen // 32, rejected // 32, t // 32
        b = 2
        seg = np.zeros((b, t), np.int32)
        br = np.zeros((b, t), np.int32)
        seg[:, :hist + chosen + rejected] = 1
        br[:, hist:hist + chosen] = 1
        br[:, hist + chosen:hist + chosen + rejected] = 2
        dtype = jnp.float32 if smoke else jnp.bfloat16
        keys = jax.random.split(jax.random.key(1), 3)
        q = jax.random.normal(keys[0], (b, t, n, h), dtype)
        kk, v = (jax.random.normal(x, (b, t, k, h), dtype) for x in keys[1:])
        return q, kk, v, jnp.asarray(seg), jnp.asarray(br), t

    def row(job, masked: bool):
        import jax
        import jax.numpy as jnp

        from sweet_jax.models import kernel_choice

        attn = _attention()
        q, kk, v, seg, br, t = build(job)
        impl = kernel_choice.attention_impl(_impl(smoke), q.dtype, (t, t), h)
        if masked:
            if impl not in ("xla", "cudnn"):
                return {"ms": None, "note": f"no fused kernel here ({impl})"}
            fn = lambda q, kk, v: attn._masked_fused(q, kk, v, seg, seg, impl=impl, scale=h ** -0.5,  # noqa: E731
                                                     q_branch_ids=br, kv_branch_ids=br)
        else:
            fn = lambda q, kk, v: attn.attention(q, kk, v, seg, seg, impl=impl, q_branch_ids=br,  # noqa: E731
                                                 kv_branch_ids=br)
        grad = jax.jit(jax.grad(lambda *x: fn(*x).astype(jnp.float32).sum(), (0, 1, 2)))
        ms = 1e3 * _median_s(lambda: grad(q, kk, v), 3 if smoke else 10)
        path = ("explicit mask" if masked else "branch rows" if impl in ("cudnn", "splash") else f"{impl} mask")
        return {"ms": ms, "impl": impl, "path": path, "shape": list(PAIR_SHAPES[job]),
                **reference_check(jax.jit(fn)(q, kk, v), reference_attention(q, kk, v, seg, br),
                                  (seg > 0)[:, :, None, None], q.dtype)}

    for job in PAIR_SHAPES:
        yield f"pairs {job} fwd+bwd", functools.partial(row, job, False)
        yield f"pairs {job} fwd+bwd, explicit mask (before)", functools.partial(row, job, True)


def _mfu_args(preset: str, segments: int, smoke: bool):
    import mfu

    p = argparse.ArgumentParser()
    mfu.add_step_arguments(p)
    p.add_argument("--peak-tflops", type=float, default=None)
    argv = ["--preset", preset, "--segments", str(segments), "--steps", "5", "--warmup", "1"]
    if smoke:
        argv += ["--preset", "tiny", "--seq", "128", "--layers", "1", "--hidden", "64", "--chunk", "64", "--dtype",
                 "float32", "--peak-tflops", "1"]
    return p.parse_args(argv)


def critic_rows(smoke: bool):
    import mfu

    for preset, segments in (("llama3.2-1b", 1), ("llama3.2-3b", 1), ("llama3.2-1b", 4)):
        label = {"llama3.2-1b": "1B", "llama3.2-3b": "3B"}[preset]
        name = f"critic {label} 2x4096" + (f" {segments} packed segments" if segments > 1 else "")
        # an implementation the device cannot run falls back to the next (the row's fallback_from says why)
        yield name, lambda preset=preset, segments=segments: mfu.measure_with_fallback(
            _mfu_args(preset, segments, smoke), "auto")


def split_rows(smoke: bool):
    def run():
        import jax

        import mfu
        from sweet_jax.training import steps

        built = mfu.build_critic_step(_mfu_args("llama3.2-1b", 1, smoke), "auto")
        kw = built.loss_kwargs
        params = built.state["params"]
        forward = jax.jit(lambda p, b: steps.loss_fn(p, b, **kw)[0])
        grad = jax.jit(jax.value_and_grad(lambda p, b: steps.loss_fn(p, b, **kw)[0]))
        box = [built.state]

        def full():
            box[0], metrics = built.step(box[0], built.batch)
            return metrics

        repeats = 2 if smoke else 5
        f = _median_s(lambda: forward(params, built.batch), repeats)
        g = _median_s(lambda: grad(params, built.batch), repeats)
        s = _median_s(full, repeats)
        return {"forward_ms": 1e3 * f, "backward_ms": 1e3 * (g - f), "optimizer_ms": 1e3 * (s - g),
                "step_ms": 1e3 * s, "backward_over_forward": (g - f) / f}

    yield "split 1B 2x4096", run


PAGE_SIZE = 128  # the paged rows' page size (tokens)
# (model, batch, prompt), most wanted first: the two with targets, then the peer's shapes, then the rest
DECODE_ROWS = [("llama3.1-8b", 1, 512), ("llama3.1-8b", 64, 2048), ("llama3.2-1b", 1, 512), ("llama3.2-1b", 64, 512),
               ("llama3.1-8b", 64, 512), ("llama3.1-8b", 16, 512), ("llama3.2-1b", 16, 512),
               ("llama3.1-8b", 64, 128), ("llama3.2-1b", 64, 2048), ("llama3.2-1b", 64, 128),
               ("llama3.1-8b", 1, 128), ("llama3.1-8b", 1, 2048), ("llama3.1-8b", 16, 128), ("llama3.1-8b", 16, 2048),
               ("llama3.2-1b", 1, 128), ("llama3.2-1b", 1, 2048), ("llama3.2-1b", 16, 128), ("llama3.2-1b", 16, 2048)]


def decode_rows(smoke: bool):
    import decode_mbu

    steps = 4 if smoke else 32

    def mbu_row(model, batch, prompt, page_size=None):
        label = {"llama3.1-8b": "8B", "llama3.2-1b": "1B"}[model]
        return (f"{label} decode batch {batch} prompt {prompt}" + (f" paged ({page_size})" if page_size else ""),
                lambda: decode_mbu.measure("tiny" if smoke else model, batch, 16 if smoke else prompt, steps,
                                           "float32" if smoke else "bfloat16", page_size=page_size))

    rows = [r for r in DECODE_ROWS if r[1:] in ((1, 512), (64, 2048))] if smoke else DECODE_ROWS
    for row in rows[:2]:  # the two with targets first, dense and on the paged cache (the paged kernel on a GPU)
        yield mbu_row(*row)
        yield mbu_row(*row, page_size=8 if smoke else PAGE_SIZE)

    def copies(page_size=None):
        import jax

        from sweet_jax import models
        from sweet_jax.inference.placement import Placement
        from sweet_jax.inference.slots import SlotPrograms

        cfg = models.preset("tiny" if smoke else "llama3.1-8b", param_dtype="bfloat16", compute_dtype="bfloat16")
        batch, context = (2, 64) if smoke else (64, 2048 + 128)
        progs = SlotPrograms(cfg, Placement.build(), batch, context, chunk=max(256, page_size or 0),
                             page_size=page_size)
        params = jax.eval_shape(models.llama.unstack_layers, models.abstract_params(cfg))
        found = progs.cache_copies(params, jax.eval_shape(progs._zeros), steps=steps)
        return {"whole_cache_copies": len(found), "examples": found[:3], "page_kernel": progs.page_kernel}

    yield "8B decode step: whole-cache copies in the compiled program", copies
    # the paged kernel's copies are checked on a GPU only: interpret mode (CPU) carries its inputs through a loop
    if not smoke:
        yield "8B paged decode step: whole-pool copies in the compiled program", lambda: copies(PAGE_SIZE)
    for row in rows[2:]:
        yield mbu_row(*row)


def peer_rows(smoke: bool):
    def hf_config(preset: str):
        from transformers import LlamaConfig as HFLlamaConfig

        from sweet_jax import models

        cfg = models.preset("tiny" if smoke else preset)
        if smoke:
            cfg = cfg.replace(num_layers=1)
        hf = cfg.to_hf_dict()
        hf.pop("architectures", None)
        return cfg, HFLlamaConfig(**hf, attn_implementation="sdpa")

    def train(preset: str):
        import torch
        from transformers import LlamaForCausalLM

        cfg, hf = hf_config(preset)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        rows, t = 2, 128 if smoke else 4096
        torch.manual_seed(0)
        with torch.device(device):  # initialised where it runs (an 8B model's f32 init on the host takes minutes)
            model = LlamaForCausalLM(hf)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
        x = torch.randint(0, hf.vocab_size, (rows, t), device=device)
        times = []
        for i in range(2 + (1 if smoke else 5)):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        step = statistics.median(times)
        del model, opt
        if device == "cuda":
            torch.cuda.empty_cache()
        return {"step_s": step, "tokens_per_s": rows * t / step, "torch": torch.__version__,
                "model_tflops_per_step": cfg.train_flops_per_token(t) * rows * t / 1e12}

    def decode(preset: str, batches, prompt: int, new: int):
        import torch
        from transformers import LlamaForCausalLM

        _cfg, hf = hf_config(preset)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = LlamaForCausalLM(hf).eval()
        finally:
            torch.set_default_dtype(default)
        out = {}
        for b in batches:
            x = torch.randint(0, hf.vocab_size, (b, prompt), device=device)
            kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
            with torch.no_grad():
                model.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.generate(x, max_new_tokens=new, min_new_tokens=new, **kw)
                if device == "cuda":
                    torch.cuda.synchronize()
            out[b] = 1e3 * (time.perf_counter() - t0) / new
        del model
        return out

    yield "HF+torch critic 1B 2x4096", lambda: train("llama3.2-1b")
    yield "HF+torch critic 3B 2x4096", lambda: train("llama3.2-3b")
    for preset, label in (("llama3.2-1b", "1B"), ("llama3.1-8b", "8B")):
        batches = (1,) if smoke else (1, 16, 64)
        yield (f"HF generate {label} prompt 512",
               lambda preset=preset, batches=batches: {"step_ms_by_batch": decode(preset, batches, 16 if smoke else 512,
                                                                                  4 if smoke else 32)})


ROWS = {"versions": version_rows, "attention": attention_rows, "pairs": pair_rows, "critic": critic_rows,
        "split": split_rows, "decode": decode_rows, "peer": peer_rows}


# ------------------------------------------------------------------------------------------------- worker / parent
def run_row(name: str, run) -> dict:
    """One row: its result, failed when it raised (a kernel this device or jax cannot run, out of memory) or when
    its output is further from the reference than its tolerance."""
    t0 = time.perf_counter()
    try:
        row = {"row": name, "ok": True, **run()}
    except Exception as e:
        row = {"row": name, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    diff, tol = row.get("max_abs_diff_vs_reference"), row.get("tolerance")
    if row["ok"] and diff is not None and not diff <= tol:
        row.update(ok=False, error=f"the output differs from the reference by {diff:.3g} > tolerance {tol:g}")
    row["wall_s"] = time.perf_counter() - t0
    return row


def worker(section: str, smoke: bool) -> int:
    """Run one section's rows in turn, one JSON line per row on stdout as it ends."""
    for name, run in ROWS[section](smoke):
        print("ROW " + json.dumps(run_row(name, run), default=str), flush=True)
    return 0


def run_section(section: str, smoke: bool, limit_s: float) -> list[dict]:
    """The section's rows from a child process, stopped after `limit_s`; rows it never reported say why."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", section] + (["--smoke"] if smoke else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows, tail, deadline = [], [], time.monotonic() + limit_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    open_streams = 2
    while open_streams and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.1, deadline - time.monotonic())):
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
            elif key.fileobj is proc.stdout and line.startswith("ROW "):
                row = json.loads(line[4:])
                rows.append(row)
                print(f"  {format_row(row)}", flush=True)
            else:
                tail = (tail + [line.rstrip()])[-20:]
    if proc.poll() is None:
        proc.kill()
        reason = f"section stopped at its {limit_s:.0f} s limit"
    else:
        proc.wait()
        reason = f"section's process exited with {proc.returncode}" if proc.returncode else None
    done = {r["row"] for r in rows}
    if reason:
        last = next((line for line in reversed(tail) if line.strip()), "")
        for name, _ in _row_names(section, smoke):
            if name not in done:
                rows.append({"row": name, "ok": False, "error": f"{reason}; last stderr: {last[:300]}"})
                print(f"  {format_row(rows[-1])}", flush=True)
    return rows


def _row_names(section: str, smoke: bool):
    """The section's row names, without running anything (each row's work happens when it is called)."""
    return list(ROWS[section](smoke))


def format_row(row: dict) -> str:
    if not row.get("ok"):
        return f"{row['row']}: FAILED ({row.get('error')})"
    shown = {k: v for k, v in row.items() if k not in ("row", "ok", "examples", "errors") and v is not None}
    parts = []
    for key, value in shown.items():
        if isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        elif not isinstance(value, (dict, list)):
            parts.append(f"{key} {value}")
        else:
            parts.append(f"{key} {json.dumps(value)}")
    return f"{row['row']}: " + ", ".join(parts)


def figures(rows: dict) -> dict:
    """The target figures and the side-by-side ratios from the rows (None where a row failed, or where the figure
    needs a device peak this device has no entry for, as on CPU)."""
    def get(name, key):
        row = rows.get(name)
        return row.get(key) if row and row.get("ok") else None

    out = {
        "critic 1B 2x4096 MFU": get("critic 1B 2x4096", "mfu"),
        "critic 3B 2x4096 MFU": get("critic 3B 2x4096", "mfu"),
        "backward / forward (1B)": get("split 1B 2x4096", "backward_over_forward"),
        "8B decode batch 1 MBU": get("8B decode batch 1 prompt 512", "mbu"),
        "8B decode batch 64 prompt 2048 MBU": get("8B decode batch 64 prompt 2048", "mbu"),
        "8B decode batch 1 MBU, paged": get(f"8B decode batch 1 prompt 512 paged ({PAGE_SIZE})", "mbu"),
        "8B decode batch 64 prompt 2048 MBU, paged": get(f"8B decode batch 64 prompt 2048 paged ({PAGE_SIZE})",
                                                          "mbu"),
    }
    for job in PAIR_SHAPES:  # how much faster the jobs' own rows run on the device's kernel than on the mask
        ours, before = get(f"pairs {job} fwd+bwd", "ms"), get(f"pairs {job} fwd+bwd, explicit mask (before)", "ms")
        out[f"pairs {job}: explicit mask / kernel"] = before / ours if ours and before else None
    for label in ("1B", "3B"):
        ours, peer = get(f"critic {label} 2x4096", "step_s"), get(f"HF+torch critic {label} 2x4096", "step_s")
        out[f"critic {label} vs HF+torch"] = peer / ours if ours and peer else None
    for label in ("1B", "8B"):
        peer = get(f"HF generate {label} prompt 512", "step_ms_by_batch") or {}
        for batch, ms in peer.items():
            ours = get(f"{label} decode batch {batch} prompt 512", "step_ms")
            out[f"{label} decode batch {batch} vs HF generate"] = ms / ours if ours else None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="every row at tiny shapes (CPU, CI)")
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--budget-s", type=float, default=480.0, help="the whole suite's time (sections share it)")
    p.add_argument("--json", default=None, help="write every row and figure here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.smoke)
    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")
    start = time.monotonic()
    planned = sum(SECTION_S[s] for s in sections)
    rows: dict[str, dict] = {}
    print(f"gpu_suite {time.strftime('%Y-%m-%d %H:%M')}{' (smoke)' if args.smoke else ''}: {', '.join(sections)}",
          flush=True)
    for section in sections:
        left = args.budget_s - (time.monotonic() - start)
        share = SECTION_S[section] / planned * args.budget_s
        limit = max(10.0, min(left, 60.0 if args.smoke else share + max(0.0, left - planned)))
        planned -= SECTION_S[section]
        print(f"[{section}] up to {limit:.0f} s", flush=True)
        for row in run_section(section, args.smoke, limit):
            rows[row["row"]] = row
    figs = figures(rows)
    print(f"\n{'figure':<44}measured     target")
    for name, value in figs.items():
        shown = "n/a" if value is None else f"{value:.3g}"
        print(f"{name:<44}{shown:>8}     {targets.verdict(name, value)}")
    failed = [name for name, row in rows.items() if not row.get("ok")]
    print(f"{len(rows) - len(failed)} of {len(rows)} rows ran in {time.monotonic() - start:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.json:
        from sweet_jax.files.atomic import write_json

        write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "smoke": args.smoke, "rows": rows, "figures": figs},
                   indent=2, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
