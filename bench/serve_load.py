"""A collection-shaped load against `sweet_jax.serve` and vLLM on the same model, in the same run (target: >= 1.0x
vLLM's generated tokens per second, and a p50 request latency no higher than vLLM's).

The load: 16 conversations at once, 3 turns each. Every turn is a completion of the whole conversation so far (a
growing prompt), with 32 to 256 new tokens (ignore_eos, so both servers generate the same counts), temperature 1.
Prompts are token ids, so both servers see the same tokens. Each server is started, warmed up on a shorter run of
the same shape, measured, and stopped before the other starts.

    python bench/serve_load.py                       # SmolLM2-135M-Instruct from its GGUF wheel (see common.py)
    python bench/serve_load.py --model DIR --conversations 4 --turns 2 --max-new 64   # smaller
    SWEET_JAX_VLLM_PYTHON=... python bench/serve_load.py   # vLLM's python (default: launch/setup_vllm.sh's)
    python bench/serve_load.py --model DIR --vllm-url http://127.0.0.1:8001 --vllm-model NAME   # a running vLLM
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(args, seed: int):
    """Per conversation: the opening prompt's token ids, then per turn (new tokens, the user's next ids)."""
    rng = np.random.default_rng(seed)
    vocab = 20000  # ordinary tokens of the model's vocabulary
    convs = []
    for _ in range(args.conversations):
        opening = rng.integers(100, vocab, int(rng.integers(150, 400))).tolist()
        turns = [(int(rng.integers(args.min_new, args.max_new + 1)), rng.integers(100, vocab, int(
            rng.integers(20, 80))).tolist()) for _ in range(args.turns)]
        convs.append((opening, turns))
    return convs


async def _load(url: str, model: str, convs, seeded: bool) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=3600, max_retries=0)
    latencies, tokens = [], 0

    async def conversation(i, opening, turns):
        nonlocal tokens
        ids = list(opening)
        for k, (new, user) in enumerate(turns):
            t0 = time.perf_counter()
            r = await client.completions.create(model=model, prompt=ids, max_tokens=new, temperature=1.0,
                                                seed=1000 * i + k if seeded else None, logprobs=0,
                                                extra_body={"ignore_eos": True})
            latencies.append(time.perf_counter() - t0)
            got = len(r.choices[0].logprobs.token_logprobs)
            tokens += got
            ids += [101] * got + user  # the reply's length in stand-in ids (its text need not be re-tokenised)

    t0 = time.perf_counter()
    await asyncio.gather(*(conversation(i, o, t) for i, (o, t) in enumerate(convs)))
    wall = time.perf_counter() - t0
    await client.close()
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "p50_s": float(np.percentile(latencies, 50)), "p90_s": float(np.percentile(latencies, 90)),
            "requests": len(latencies)}


def _measure(name: str, cmd: list[str] | None, url: str, args, log_path: str, seeded: bool = True,
             model: str = "model") -> dict:
    """Start `cmd` (a server on `url`; None: one is running there, serving `model`), warm it up, measure it, stop
    what was started."""
    from sweet_jax.inference.backends import healthy

    t0 = time.time()
    proc = None if cmd is None else subprocess.Popen(cmd, cwd=ROOT, stdout=open(log_path, "w"),
                                                     stderr=subprocess.STDOUT)
    try:
        while not healthy(url):
            if proc is None or proc.poll() is not None or time.time() - t0 > 1800:
                log = f"; log {log_path}:\n{open(log_path).read()[-3000:]}" if proc else ""
                raise SystemExit(f"{name} at {url} did not answer /health{log}")
            time.sleep(1)
        started = time.time() - t0
        asyncio.run(_load(url, model, _script(args, seed=1), seeded))  # warm-up: the same shapes, other tokens
        result = {**asyncio.run(_load(url, model, _script(args, seed=0), seeded)), "startup_s": started}
        print(f"  {name:<16} {result['tokens_per_s']:7.1f} tokens/s   p50 {result['p50_s']:6.2f} s   p90 "
              f"{result['p90_s']:6.2f} s   ({result['tokens']} tokens in {result['seconds']:.1f} s; "
              + (f"started in {started:.0f} s)" if proc else "already running)"), flush=True)
        return result
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF directory (default: SmolLM2-135M-Instruct, made once)")
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--min-new", type=int, default=32)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--vllm-python", default=os.environ.get("SWEET_JAX_VLLM_PYTHON"))
    p.add_argument("--vllm-args", default="", help="more vLLM flags, e.g. --enforce-eager (a faster start)")
    p.add_argument("--vllm-url", default=None, help="measure the vLLM already serving --model here (its own flags) "
                   "instead of starting one")
    p.add_argument("--vllm-model", default="model", help="the model name the server at --vllm-url serves")
    p.add_argument("--serve-args", default="", help="more sweet_jax.serve flags, e.g. --prefill-chunk 128")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args()
    from common import smollm2_dir

    model = args.model or smollm2_dir()
    logs = os.path.join(os.environ.get("TMPDIR", "/tmp"), "serve_load")
    os.makedirs(logs, exist_ok=True)
    slots = str(args.conversations)
    port = _port()
    ours = _measure("sweet_jax.serve", [sys.executable, "-m", "sweet_jax.serve", "--model", model, "--port",
                                         str(port), "--served-model-name", "model", "--max-batch", slots,
                                         "--max-model-len", str(args.max_model_len), *shlex.split(args.serve_args)],
                    f"http://127.0.0.1:{port}", args, os.path.join(logs, "sweet_jax.log"))
    # unseeded: vLLM 0.32's CPU build dies on a seeded request whose prefill is split over steps ("CPU Generator
    # does not use offset"), which chunked prefill does under this load; a seed changes nothing else in its speed
    if args.vllm_url:
        vllm = _measure("vLLM", None, args.vllm_url.rstrip("/").removesuffix("/v1"), args, "", seeded=False,
                        model=args.vllm_model)
    else:
        vllm_python = args.vllm_python or subprocess.run(
            ["bash", os.path.join(ROOT, "launch", "setup_vllm.sh")], capture_output=True, text=True,
            check=True).stdout.strip()
        port = _port()
        vllm = _measure("vLLM", [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port",
                                 str(port), "--served-model-name", "model", "--max-model-len",
                                 str(args.max_model_len), "--max-num-seqs", slots, "--dtype", "float32",
                                 "--gpu-memory-utilization", "0.15", *shlex.split(args.vllm_args)],
                        f"http://127.0.0.1:{port}", args, os.path.join(logs, "vllm.log"), seeded=False)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown CPU")
    print(f"{args.conversations} conversations x {args.turns} turns, {args.min_new}-{args.max_new} new tokens, "
          f"{model} on {os.cpu_count()} cores ({cpu}), {time.strftime('%Y-%m-%d')}")
    print(f"  ratio: {ours['tokens_per_s'] / vllm['tokens_per_s']:.2f}x vLLM's tokens/s, p50 "
          f"{ours['p50_s'] / vllm['p50_s']:.2f}x vLLM's")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"sweet_jax": ours, "vllm": vllm, "cpu": cpu}, fh, indent=2)


if __name__ == "__main__":
    main()
