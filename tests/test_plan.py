"""`python -m sweet_jax.plan`: the real train step compiled ahead of time for a mesh of fake devices."""

import json
import re
import os
import subprocess
import sys

import budget
import jax
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.training.planning import PlanError, parse_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.data.max_len=256", "--config.model.preset_overrides.num_layers=1"]


def _plan(*args):
    cmd = [sys.executable, "-m", "sweet_jax.plan", "--config", os.path.join(ROOT, "configs", "critic_tiny.py"),
           *TINY, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())


# One training token of critic_tiny's model (hidden 64, MLP 176, 1 layer, 4 heads and 2 KV heads of 16, the cut-down
# Llama-3 vocabulary of 8,192, 256-token rows), by hand: 6 FLOPs (forward and backward) per matmul weight (q 64x64, k
# and v 64x32, o 64x64, gate/up/down 3 x 64x176, the tied LM head 64x8192 = 570,368 weights) and 3 x the causal
# attention's forward (scores and weighted values, 2 x 2 x 4 x 16 x 256/2 = 32,768): 3,422,208 + 98,304.
TINY_FLOPS_PER_TOKEN = 3_520_512
# The same with the full Llama-3 vocabulary: the tied LM head 64x128256 = 8,254,464 weights, 49,526,784 + 98,304.
FULL_VOCAB = "--config.model.preset_overrides.vocab_size=128256"
FULL_VOCAB_FLOPS_PER_TOKEN = 49_625_088


def test_plan_reports_per_device_memory_that_matches_the_shapes(tmp_path):
    out = tmp_path / "plan.json"
    proc = _plan("--mesh", "fsdp=2", "--hbm-gib", "80", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verdict: FITS" in proc.stdout and "mesh {'data': 1, 'fsdp': 2, 'tensor': 1} (2 devices)" in proc.stdout
    doc = json.loads(out.read_text())
    p = doc["plan"]
    cfg = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=176, num_layers=1, num_heads=4,
                                    num_kv_heads=2, tie_word_embeddings=True, vocab_size=8192)
    # Every matrix splits over fsdp=2 and the (2L + 1) RMSNorm scales are replicated (f32); the frozen tied
    # embedding has no Adam state, the rest has two moments.
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size
    assert p["params_bytes"] == (cfg.num_params() - norms) * 4 / 2 + norms * 4
    embed = cfg.vocab_size * cfg.hidden_size
    assert p["opt_state_bytes"] == pytest.approx(2 * ((cfg.num_params() - norms - embed) * 4 / 2 + norms * 4), abs=64)
    # XLA's arguments are the state plus the batch; the updated state is written over the donated one.
    assert p["params_bytes"] + p["opt_state_bytes"] < p["argument_bytes"] < p["params_bytes"] + p["opt_state_bytes"] + 2**20
    assert p["alias_bytes"] >= p["params_bytes"] + p["opt_state_bytes"] - 64
    assert p["temp_bytes"] > 0 and p["total_bytes"] < 80 * 2**30
    # critic_tiny's 8 pairs of 256 tokens, each token's model FLOPs counted by hand
    assert (p["micro_batch_size"], p["sequences"], p["seq_len"]) == (8, 16, 256)
    assert p["model_flops"] == TINY_FLOPS_PER_TOKEN * 16 * 256


def test_a_lora_plan_holds_a_bf16_base_and_adam_state_for_the_adapters_alone(tmp_path):
    out = tmp_path / "plan.json"
    proc = _plan("--mesh", "fsdp=1", "--json", str(out), "--config.lora.rank=4", "--config.model.param_dtype=bfloat16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "planned without XLA:CPU's hoisted f32 copies of the weights" in proc.stdout
    p = json.loads(out.read_text())["plan"]
    cfg = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=176, num_layers=1, num_heads=4,
                                    num_kv_heads=2, tie_word_embeddings=True, vocab_size=8192)
    # rank-4 adapters on q, k, v, o: A 64x4 (q, k, v) and 4x4x16 (o), B 4x4x16 (q), 4x2x16 (k, v), 4x64 (o)
    adapters = 3 * 64 * 4 + 4 * 16 * 4 + 4 * 64 + 2 * 4 * 2 * 16 + 4 * 64
    assert p["params_bytes"] == cfg.num_params() * 2 + adapters * 4  # the base in bf16, the adapters in f32
    assert p["opt_state_bytes"] == pytest.approx(2 * adapters * 4, abs=64)  # two Adam moments of the adapters
    assert p["frozen_reference_bytes"] == 0


@pytest.mark.slow
def test_over_budget_exits_1_and_names_the_remat_setting_that_fits(tmp_path):
    # 4 layers: their saved activations outweigh the one attention layer's working set, which no remat policy cuts
    # (with a single layer, full remat needs more than none)
    deep = ("--config.model.preset_overrides.num_layers=4",)
    none = tmp_path / "none.json"
    proc = _plan("--mesh", "fsdp=2", "--config.model.remat_policy=none", "--config.data.max_len=2048", *deep,
                 "--json", str(none))
    assert proc.returncode == 0, proc.stderr[-3000:]
    used = json.loads(none.read_text())["plan"]["total_bytes"] / 2**30
    full = json.loads(none.read_text())["plan"]
    # A budget just under the remat-free figure: over as configured, and a stronger policy fits.
    out = tmp_path / "over.json"
    proc = _plan("--mesh", "fsdp=2", "--config.model.remat_policy=none", "--config.data.max_len=2048", *deep,
                 "--hbm-gib", str(used * 0.98), "--json", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert not doc["fits"] and doc["suggestion"].startswith("--config.model.remat_policy=")
    assert f"verdict: OVER BUDGET; fits with {doc['suggestion']}" in proc.stdout
    last = doc["alternatives"][-1]
    assert last["total_bytes"] <= used * 0.98 * 2**30 < full["total_bytes"]
    assert last["temp_bytes"] < full["temp_bytes"]


@pytest.mark.slow
def test_a_packed_plan_compiles_one_prefix_shared_row_per_pair_and_needs_less(tmp_path):
    """--turn-len plans what the trainer runs on pairs that share a history: one row of history + two turns per pair
    (a 224-token history and two 32-token turns here, padded to the 384-token row bucket) instead of two full rows.
    With the full 128k vocabulary, where the vocabulary projection's working set outweighs the attention scores (as
    at 8B): with the toy configs' 8k one, the padded row's larger attention scores take more than the packing saves."""
    plain, packed = tmp_path / "plain.json", tmp_path / "packed.json"
    proc = _plan("--mesh", "fsdp=2", FULL_VOCAB, "--json", str(plain))
    assert proc.returncode == 0 and "plan that with --turn-len N" in proc.stdout, proc.stderr[-3000:]
    proc = _plan("--mesh", "fsdp=2", FULL_VOCAB, "--turn-len", "32", "--json", str(packed))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("8 pairs = 8 prefix-shared rows x 384 tokens (a 224-token history, then two 32-token turns, 96 tokens of "
            "padding to the row bucket)") in proc.stdout
    assert "--turn-len N" not in proc.stdout
    p, q = json.loads(plain.read_text())["plan"], json.loads(packed.read_text())["plan"]
    assert (q["micro_batch_size"], q["sequences"], q["seq_len"], q["turn_len"], q["row_len"]) == (8, 8, 256, 32, 384)
    assert (p["sequences"], p["turn_len"], p["row_len"]) == (16, 0, 256)
    assert q["model_flops"] == FULL_VOCAB_FLOPS_PER_TOKEN * 8 * 288  # 288 tokens a pair, not 512
    assert q["params_bytes"] == p["params_bytes"] and q["temp_bytes"] < p["temp_bytes"]
    for bad, message in [
            (("--turn-len", "256"), "turn_len=256 must be between 1 and the sequence length - 1"),
            (("--turn-len", "32", "--config.data.pack_pairs=False"), "turn_len=32: data.pack_pairs is off"),
            (("--turn-len", "32", "--config.objective=reward"), "turn_len=32: objective 'reward' trains on plain")]:
        proc = _plan("--mesh", "fsdp=2", *bad)
        assert proc.returncode == 2 and f"error: {message}" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("packed", [False, True])
def test_the_planned_batch_is_the_batch_the_trainer_collates(packed):
    """The abstract batch the plan compiles has the keys, shapes and dtypes of the Batcher's real batch of
    worst-case pairs (every token scored): a plan cannot drift from the step the trainer runs."""
    import jax
    import ml_collections
    import numpy as np

    from sweet_jax.parallel import sharding
    from sweet_jax.data.examples import Example
    from sweet_jax.training import aot, splits
    from sweet_jax.training.partitioning import Layout
    from sweet_jax.training.batcher import Batcher

    seq, turn, pairs = 256, 32, 2
    rng = np.random.default_rng(0)

    def example(tokens):  # every token scored (the plan's worst case)
        n = len(tokens)
        return Example(np.asarray(tokens, np.int32), np.ones(n, bool), np.ones(n, bool), np.zeros(n, np.int32),
                       False, "test")

    items = []
    for _ in range(pairs):
        history = rng.integers(0, 100, seq - turn).tolist()
        items.append((example(history + rng.integers(100, 200, turn).tolist()),
                      example(history + rng.integers(200, 300, turn).tolist())))
    cfg = ml_collections.ConfigDict(dict(data=dict(max_len=seq, min_bucket=128, pack_length=0, shapes="batch"),
                                         loss=dict(nll_span="score")))
    real = Batcher(cfg, 0)(splits.Split(items, paired=True, packed=packed), np.arange(pairs),
                           np.zeros((pairs, 2), np.float32))
    model_cfg = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                                          num_kv_heads=2)
    layout = Layout(sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]), model_cfg, None)
    planned = aot.abstract_batch(layout, pairs if packed else 2 * pairs, seq, "critic", turn if packed else 0, 128)
    assert real["tokens"].shape[1] == (384 if packed else 256)  # the 288-token pair row, in the bucket above max_len
    assert {k: (v.shape, np.dtype(v.dtype)) for k, v in planned.items()} == \
        {k: (v.shape, v.dtype) for k, v in real.items()}


def test_bad_mesh_is_one_clear_line():
    proc = _plan("--mesh", "fsdp=2,model=4")
    assert proc.returncode == 2 and "error: --mesh 'fsdp=2,model=4'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_parse_mesh():
    assert parse_mesh("fsdp=8", {}, None) == ({"data": 1, "fsdp": 8, "tensor": 1}, 8)
    assert parse_mesh("data=2,fsdp=-1,tensor=2", {}, 16) == ({"data": 2, "fsdp": 4, "tensor": 2}, 16)
    assert parse_mesh(None, {"data": 1, "fsdp": 4, "tensor": 2}, None) == ({"data": 1, "fsdp": 4, "tensor": 2}, 8)
    with pytest.raises(PlanError, match="give --devices"):
        parse_mesh(None, {"data": 1, "fsdp": -1, "tensor": 1}, None)
    with pytest.raises(PlanError, match="do not divide"):
        parse_mesh("fsdp=-1,tensor=3", {}, 8)
    with pytest.raises(PlanError, match="has 8 devices, but --devices=4"):
        parse_mesh("fsdp=8", {}, 4)


def test_serve_plan_reports_the_per_device_weights_and_kv_cache(tmp_path):
    """`plan --serve` on 2 fake devices: the KV cache is slots x context x layers x 2 (k, v) x KV heads x head_dim
    at 2 bytes, split over the tensor axis, and the weights are half of the bf16 model's bytes (all but the norms
    split)."""
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.plan", "--serve", "--model", "tiny", "--mesh", "tensor=2",
                           "--batch", "4", "--context", "256", "--hbm-gib", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "KV cache" in proc.stdout and "fits in 1 GiB" in proc.stdout
    plan = json.loads(out.read_text())
    cfg = models.preset("tiny")
    kv = 4 * 256 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2 / 2
    assert plan["kv_cache_bytes"] == kv
    n_params = sum(int(np.prod(s)) for s in jax.tree.leaves(models.param_shapes(cfg), is_leaf=lambda x: isinstance(
        x, tuple) and all(isinstance(i, int) for i in x)))
    assert 0.5 * n_params * 2 <= plan["weights_bytes"] <= 0.51 * n_params * 2


def test_serve_plan_of_a_paged_cache_sizes_it_for_the_mean_live_tokens(tmp_path):
    """`--mean-live 96 --page-size 32`: 4 slots x 3 pages + scratch, each page 32 positions x layers x 2 (k, v) x
    KV heads x head_dim at 2 bytes, split over tensor=2; the dense cache would take 4 x 256 positions. The plan ends
    with the `kv cache:` line."""
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.plan", "--serve", "--model", "tiny", "--mesh", "tensor=2",
                           "--batch", "4", "--context", "256", "--mean-live", "96", "--page-size", "32", "--json",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = models.preset("tiny")
    per_position = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2 / 2
    assert json.loads(out.read_text())["kv_cache_bytes"] == (4 * 3 + 1) * 32 * per_position
    assert "paged: 13 pages of 32 tokens for a mean of 96 live tokens per slot" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"kv cache: {13 * 32 * per_position / 2 ** 30:.2f} GiB per device", proc.stdout


def test_plan_lists_the_kernels_a_device_would_run(tmp_path):
    """`plan --device l4` lowers the planned step (prefix-shared pairs here) for a simulated L4 and lists its fused
    kernels: cuDNN with sequence lengths, forward and backward, nothing the L4 cannot run."""
    out = tmp_path / "plan.json"
    proc = _plan("--mesh", "fsdp=2", "--turn-len", "32", "--device", "l4", "--json", str(out),
                 "--config.model.compute_dtype=bfloat16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^kernels on NVIDIA L4, sm89, .*\(simulated\): cudnn x2$", proc.stdout, re.M), proc.stdout
    doc = json.loads(out.read_text())["device_kernels"]
    assert doc["kernels"] == {"cudnn": 2} and doc["unsupported"] == []
