"""Inference on a mesh equals inference on one device: 8 fake CPU devices, meshes (data=2, tensor=4), (tensor=8 on a
model with 2 KV heads, widened to 8), (data=8) and tensor=8 on a paged KV cache. Greedy and seeded sampled tokens are
identical, log-probs and ranking scores agree to 1e-5, and the compiled decode step gathers no weight and no cache
array whole."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import budget
import pytest
from multidevice import device_flags, run_with_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = ("data=2,tensor=4", "tensor=8", "data=8")

SETUP = """
import json, re
import jax, numpy as np
from sweet_jax import models
from sweet_jax.inference.placement import Placement
from sweet_jax.inference.prefix_scoring import continuation_logprobs, continuation_values
from sweet_jax.inference.sampling import SamplingParams
from sweet_jax.inference.scheduler import generate
from sweet_jax.inference.slots import SlotPrograms

# vocabulary and heads divide by 8; 2 KV heads; sizes chosen so that no weight has an activation's element count
CFG = models.LlamaConfig.preset("tiny", vocab_size=520, hidden_size=64, intermediate_size=192, num_layers=2,
                                num_heads=8, num_kv_heads=2)
params = models.init_params(CFG, jax.random.key(0), std=0.1)
head = models.init_params(CFG.replace(score_head=True), jax.random.key(1), std=0.1)
rng = np.random.default_rng(0)
PROMPTS = [rng.integers(0, 520, n).tolist() for n in (5, 23, 1, 40)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
HOT = [SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10), SamplingParams(temperature=0.8, max_tokens=7),
       SamplingParams(temperature=1.2, top_k=20, max_tokens=12), SamplingParams(temperature=1.0, max_tokens=9)]
PREFIX = rng.integers(0, 520, 37).tolist()
CANDS = [rng.integers(0, 520, n).tolist() for n in (3, 11, 6, 1, 9)]


def run(placement, page_size=None):
    p, cfg = placement.prepare(params, CFG)
    h, hcfg = placement.prepare(head, CFG.replace(score_head=True))
    greedy = generate(p, cfg, PROMPTS, GREEDY, placement=placement, page_size=page_size)
    # 12 samples through the greedy run's 4 slots (each slot taken again as one finishes): both runs share one set
    # of compiled programs
    hot = generate(p, cfg, PROMPTS, HOT, n=3, seed=[4, 5, 6, 7], placement=placement, page_size=page_size,
                   max_slots=4)
    lps = continuation_logprobs(p, cfg, PREFIX, CANDS, placement=placement)
    pv, cv = continuation_values(h, hcfg, PREFIX, CANDS, placement=placement)
    return {"greedy": [s.tokens for r in greedy for s in r],
            "sampled": [s.tokens for r in hot for s in r],
            "logprobs": [x for r in hot for s in r for x in s.logprobs],
            "ranking": [float(x) for c in lps for x in c] + [float(x) for c in cv for x in c] + pv.tolist()}


def gathers(placement):
    \"\"\"Element counts of the all-gathers in the compiled decode step, and of every sharded weight and cache
    array.\"\"\"
    p, cfg = placement.prepare(params, CFG)
    progs = SlotPrograms(cfg, placement, slots=8, context=64)
    with placement.active():
        text = progs.decode_program(4, 64).lower(p, progs.new_state()).compile().as_text()
    sizes = []
    for line in text.splitlines():
        if " all-gather(" in line or "all-gather-start(" in line:
            shape = re.search(r"= [a-z0-9]+\\[([0-9,]*)\\]", line)
            sizes.append(int(np.prod([int(x) for x in shape.group(1).split(",") if x])) if shape else -1)
    state = progs.new_state()
    whole = {int(x.size) for x in jax.tree.leaves(p) + jax.tree.leaves(state["cache"])
             if not x.sharding.is_fully_replicated}
    return sizes, sorted(whole)
"""


@pytest.fixture(scope="module")
def results():
    code = SETUP + """
out = {"one": run(Placement.build())}
for mesh in %r:
    out[mesh] = run(Placement.build(mesh))
    out[mesh]["gathers"], out[mesh]["weights"] = gathers(Placement.build(mesh))
out["tensor=8, paged"] = run(Placement.build("tensor=8"), page_size=8)  # KV heads split over the pool's pages
print("RESULT" + json.dumps(out))
""" % (MESHES,)
    stdout = run_with_devices(code, n=8)
    return json.loads(stdout.split("RESULT", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES + ("tensor=8, paged",))
def test_greedy_and_sampled_tokens_are_identical(results, mesh):
    assert results[mesh]["greedy"] == results["one"]["greedy"]
    assert results[mesh]["sampled"] == results["one"]["sampled"]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES + ("tensor=8, paged",))
def test_logprobs_and_ranking_scores_agree(results, mesh):
    import numpy as np

    for key in ("logprobs", "ranking"):
        a, b = np.asarray(results[mesh][key]), np.asarray(results["one"][key])
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-5, (key, np.abs(a - b).max())


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_the_decode_step_gathers_no_weight_or_cache_whole(results, mesh):
    gathered, whole = results[mesh]["gathers"], set(results[mesh]["weights"])
    assert whole, "nothing is sharded on this mesh"
    assert not whole & set(gathered), (gathered, sorted(whole))


def _serve(model_dir, port, log, mesh=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=device_flags(8))
    cmd = [sys.executable, "-m", "sweet_jax.serve", "--model", str(model_dir), "--port", str(port),
           "--max-model-len", "256", "--max-batch", "8"] + (["--mesh", mesh] if mesh else [])
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait(url, proc, log_path):
    deadline = time.time() + budget.time_left()
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None:
                raise AssertionError(open(log_path).read()[-3000:])
            time.sleep(0.5)
    raise AssertionError(f"{url} did not come up: {open(log_path).read()[-3000:]}")


@pytest.mark.slow
def test_serve_on_a_mesh_gives_the_one_device_greedy_completions(tmp_path):
    import jax
    import openai

    from sweet_jax import models

    cfg = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                                    num_kv_heads=2)
    models.save_hf_params(models.init_params(cfg, jax.random.key(0), std=0.1), cfg, tmp_path / "model")
    procs, urls = [], []
    try:
        for i, mesh in enumerate((None, "data=2,tensor=4")):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            log = tmp_path / f"serve{i}.log"
            procs.append(_serve(tmp_path / "model", port, open(log, "w"), mesh))
            urls.append((f"http://127.0.0.1:{port}", log))
        for (url, log), proc in zip(urls, procs):
            _wait(url, proc, log)
        replies = []
        for url, _ in urls:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300)
            replies.append([client.completions.create(model="m", prompt=p, max_tokens=16, temperature=0.0,
                                                      seed=0).choices[0].text
                            for p in ("Hello there", "def f(x):", "The capital of France is")])
        assert replies[0] == replies[1] and any(replies[0])
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
