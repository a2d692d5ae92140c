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
