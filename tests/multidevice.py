"""Run a snippet in a fresh Python with N fake CPU devices (XLA_FLAGS must be set before jax is imported)."""

import os
import subprocess
import sys
import textwrap


def run_with_devices(code: str, n: int = 8, timeout: int = 600) -> str:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"subprocess failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-5000:]}")
    return proc.stdout
