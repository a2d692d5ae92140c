"""One accelerator suite: the train step and the decode step against their targets and against HF + torch, side by
side on the same device, in at most 8 minutes on one H200.

    python bench/gpu_suite.py --json suite.json            # on a GPU host (the device image: carry ml_collections)
    python bench/gpu_suite.py --smoke                      # every row at tiny shapes, on CPU (CI runs this)
    python bench/gpu_suite.py --sections attention,critic  # some sections only

Sections, in the order they run (each in a child process of its own, so a crash or an out-of-memory loses that
section's remaining rows only; a row that fails says why and the next one runs):
- attention: fused attention fwd+bwd at [2, 4,096], 32/8 heads x 64, for whole rows (is_causal alone), one segment
  plus padding (sequence lengths), 4 packed segments (cuDNN's offsets) and the explicit mask; each checked against
  the reference attention; and decode attention alone (8B shapes, batch 64, 2,048 keys).
- critic: critic train-step MFU (`bench/mfu.py`), 1B and 3B at 2 x 4,096, and 1B with 4 packed documents per row.
- split: the 1B step's forward loss, value_and_grad and full step: forward, backward and optimiser times.
- decode: decode MBU (`bench/decode_mbu.py`) for 1B and 8B at batch 1/16/64 and prompts 128/512/2,048, the two
  target rows also on the paged KV cache (on a GPU: JAX's Pallas paged-attention kernel, reading each row's live
  pages only), and the compiled 8B decode steps checked for whole-cache copies (`SlotPrograms.cache_copies`).
- peer: HF `LlamaForCausalLM` + torch fused AdamW (autocast bf16, SDPA) on the critic shapes, and HF generate()
  on the decode shapes.
The summary compares each target figure with its target and each sweet_jax row with its peer row.
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

SECTIONS = ("attention", "critic", "split", "decode", "peer")
# seconds each section may take on the real shapes (the whole suite: 8 minutes); --smoke: a minute each at most
SECTION_S = {"attention": 50, "critic": 110, "split": 60, "decode": 160, "peer": 100}
TARGETS = {  # figure -> (target, "min" or "max")
    "critic 1B 2x4096 MFU": (0.48, "min"),
    "critic 3B 2x4096 MFU": (0.50, "min"),
    "critic 1B vs HF+torch": (1.35, "min"),
    "backward / forward (1B)": (2.2, "max"),
    "8B decode batch 1 MBU": (0.80, "min"),
    "8B decode batch 64 prompt 2048 MBU": (0.60, "min"),
    "8B decode batch 1 MBU, paged": (0.80, "min"),
    "8B decode batch 64 prompt 2048 MBU, paged": (0.60, "min"),
}


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


def attention_rows(smoke: bool):
    """The attention section's rows. Nothing runs (no jax, no device memory) until a row is called: the parent
    process lists a failed section's rows by name."""
    b, t, n, k, h = (2, 128, 4, 2, 16) if smoke else (2, 4096, 32, 8, 64)
    impl = "auto"

    @functools.cache
    def inputs():
        import jax
        import jax.numpy as jnp

        attn = _attention()
        dtype = jnp.float32 if smoke else jnp.bfloat16
        keys = jax.random.split(jax.random.key(0), 3)
        qkv = (jax.random.normal(keys[0], (b, t, n, h), dtype),
               *(jax.random.normal(x, (b, t, k, h), dtype) for x in keys[1:]))
        pad = t // 10
        segments = dict(zip(LAYOUTS, (jnp.ones((b, t), jnp.int32),
                                      jnp.broadcast_to((jnp.arange(t) < t - pad).astype(jnp.int32), (b, t)),
                                      jnp.broadcast_to(jnp.arange(t) // (t // 4) + 1, (b, t)).astype(jnp.int32))))
        return qkv, segments, attn.resolve_impl(impl, dtype, (t, t))

    def layout_row(name):
        import jax
        import jax.numpy as jnp

        attn = _attention()
        (q, kk, v), segments, chosen = inputs()
        seg = segments[name]
        grad = jax.jit(jax.grad(lambda q, kk, v: attn.attention(q, kk, v, seg, seg, impl=impl).astype(
            jnp.float32).sum(), (0, 1, 2)))
        ms = 1e3 * _median_s(lambda: grad(q, kk, v), 3 if smoke else 10)
        real = (seg > 0)[:, :, None, None]
        f32 = [x.astype(jnp.float32) for x in (q, kk, v)]
        got = jax.jit(lambda q, kk, v: attn.attention(q, kk, v, seg, seg, impl=impl))(q, kk, v)
        ref = jax.jit(lambda q, kk, v: attn.reference_attention(q, kk, v, seg, seg))(*f32)
        diff = float(jnp.max(jnp.where(real, jnp.abs(got.astype(jnp.float32) - ref), 0)))
        path = {attn.MASKED: "masked", attn.ONE_SEGMENT: "one segment", attn.WHOLE_ROWS: "whole rows",
                attn.PACKED: "packed"}[int(attn.fused_path(attn.segment_layout(seg), chosen))]
        return {"ms": ms, "max_abs_diff_vs_reference": diff, "path": path, "impl": chosen}

    for name in LAYOUTS:
        yield f"attention fwd+bwd {name}", functools.partial(layout_row, name)

    def masked():
        import jax
        import jax.numpy as jnp

        attn = _attention()
        (q, kk, v), segments, chosen = inputs()
        seg = segments[LAYOUTS[2]]
        if chosen not in ("xla", "cudnn"):
            return {"ms": None, "note": f"no fused kernel here ({chosen})"}
        grad = jax.jit(jax.grad(lambda q, kk, v: attn._masked_fused(q, kk, v, seg, seg, impl=chosen,
                                                                     scale=h ** -0.5).astype(jnp.float32).sum(),
                                (0, 1, 2)))
        return {"ms": 1e3 * _median_s(lambda: grad(q, kk, v), 10), "impl": chosen}

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
        yield name, lambda preset=preset, segments=segments: mfu.measure(_mfu_args(preset, segments, smoke), "auto")


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


ROWS = {"attention": attention_rows, "critic": critic_rows, "split": split_rows, "decode": decode_rows,
        "peer": peer_rows}


# ------------------------------------------------------------------------------------------------- worker / parent
def worker(section: str, smoke: bool) -> int:
    """Run one section's rows in turn, one JSON line per row on stdout as it ends."""
    for name, run in ROWS[section](smoke):
        t0 = time.perf_counter()
        try:
            result = run()
            row = {"row": name, "ok": True, **result}
        except Exception as e:  # a kernel this device or jax cannot run, out of memory: say so, go on
            row = {"row": name, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        row["wall_s"] = time.perf_counter() - t0
        print("ROW " + json.dumps(row, default=str), flush=True)
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
        target = TARGETS.get(name)
        shown = "n/a" if value is None else f"{value:.3g}"
        verdict = ""
        if target and value is not None:
            good = value >= target[0] if target[1] == "min" else value <= target[0]
            verdict = f"{'>=' if target[1] == 'min' else '<='} {target[0]:g}: {'PASS' if good else 'below target'}"
        print(f"{name:<44}{shown:>8}     {verdict}")
    failed = [name for name, row in rows.items() if not row.get("ok")]
    print(f"{len(rows) - len(failed)} of {len(rows)} rows ran in {time.monotonic() - start:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.json:
        from sweet_jax.files.atomic import write_json

        write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "smoke": args.smoke, "rows": rows, "figures": figs},
                   indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
