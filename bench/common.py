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


def smollm2_dir(cache: str | None = None) -> str:
    """SmolLM2-135M-Instruct as an HF directory, imported once from its GGUF (`sweet_jax.models.gguf_import`)."""
    from sweet_jax.models.gguf_import import smollm2_instruct_dir

    return smollm2_instruct_dir(cache)
