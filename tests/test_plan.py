"""`python -m sweet_jax.plan`: the real train step compiled ahead of time for a mesh of fake devices."""

import json
import os
import subprocess
import sys

import pytest

from sweet_jax import models
from sweet_jax.plan import PlanError, parse_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.data.max_len=256", "--config.model.preset_overrides.num_layers=1"]


def _plan(*args, timeout=300):
    cmd = [sys.executable, "-m", "sweet_jax.plan", "--config", os.path.join(ROOT, "configs", "critic_tiny.py"),
           *TINY, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_plan_reports_per_device_memory_that_matches_the_shapes(tmp_path):
    out = tmp_path / "plan.json"
    proc = _plan("--mesh", "fsdp=2", "--hbm-gib", "80", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verdict: FITS" in proc.stdout and "mesh {'data': 1, 'fsdp': 2, 'tensor': 1} (2 devices)" in proc.stdout
    doc = json.loads(out.read_text())
    p = doc["plan"]
    cfg = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=176, num_layers=1, num_heads=4,
                                    num_kv_heads=2, tie_word_embeddings=True)
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
    # critic_tiny's 8 pairs of 256 tokens; model FLOPs by the config's formula (checked in test_config)
    assert (p["micro_batch_size"], p["sequences"], p["seq_len"]) == (8, 16, 256)
    assert p["model_flops"] == cfg.train_flops_per_token(256) * 16 * 256


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
