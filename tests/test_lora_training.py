"""LoRA training end to end (`python -m sweet_jax.train` with `lora.rank` > 0) on a tiny HF base model: a critic job
and a DPO job resume bit for bit after kill -9, their checkpoints hold the adapters alone, and their exports load in
PEFT (the adapter on the HF base) and in transformers (the merged model) with sweet_jax's logits."""

import copy
import json
import os

import budget
import numpy as np
import pytest
import safetensors.numpy
from hf_reference import hf_logits, make_hf_llama
from system import train_then_kill
from test_train import _cmd, _run

peft = pytest.importorskip("peft")
LORA = ["--config.lora.rank=4", "--config.lora.alpha=8", "--config.lora.targets=q_proj,v_proj,o_proj,up_proj,down_proj",
        "--config.optim.lr=3e-3"]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A tiny HF Llama over the toy jobs' 8k vocabulary (the bundled cut-down Llama-3 tokenizer's)."""
    out = tmp_path_factory.mktemp("base")
    make_hf_llama(out, vocab=8192, hidden=64, inter=176, layers=2, heads=4, kv_heads=2, init_std=0.1)
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("config, extra, peft_tol", [
    # the critic on a bf16 base: cached reference scores (the base), adapter dropout (its masks are a function of
    # the step). sweet_jax merges into bf16 weights (as its export does), PEFT adds the adapter's term in f32.
    ("critic_tiny.py", ["--config.lora.dropout=0.1", "--config.model.param_dtype=bfloat16"], 5e-3),
    # multi-turn DPO on an f32 base: the reference recomputed in every step from the same base, the adapters off
    ("mtdpo_tiny.py", ["--config.loss.reference=recompute"], 1e-4),
])
def test_a_lora_job_resumes_bit_identically_after_kill_9_and_exports_what_peft_loads(tmp_path, base_dir, config,
                                                                                      extra, peft_tol):
    import torch
    import transformers
    from sweet_jax.models.loading import load_model

    args = [f"--config.model.hf_path={base_dir}", *LORA, *extra]
    ref = _run(config, tmp_path / "uninterrupted", *args)
    assert ref.returncode == 0, ref.stderr[-3000:]
    total = json.loads((tmp_path / "uninterrupted" / "metrics.json").read_text())["steps"]
    out = tmp_path / "killed"
    killed_at = train_then_kill(_cmd(config, out, *args), out, 2, budget.time_left())
    assert killed_at < total, "the job finished before it could be killed"
    resumed = _run(config, out, *args)
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr[-3000:]
    for export in ("adapter/adapter_model.safetensors", "hf/model.safetensors"):
        assert (tmp_path / "uninterrupted" / export).read_bytes() == (out / export).read_bytes(), export

    # the checkpoint holds the adapters, their Adam state and the step: no base weight
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(str(out / "checkpoints"))
    saved = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore())
    assert set(saved) == {"params", "opt_state", "step"} and set(saved["params"]) == {"lora"}
    adapters = safetensors.numpy.load_file(out / "adapter" / "adapter_model.safetensors")
    assert max(float(np.abs(v).max()) for k, v in adapters.items() if "lora_B" in k) > 1e-3  # B was trained

    # PEFT puts the exported adapter on the HF base; transformers loads the merged export; sweet_jax loads the run
    tokens = np.random.default_rng(0).integers(0, 8192, (2, 16))
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    adapted = peft.PeftModel.from_pretrained(copy.deepcopy(base), out / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32).eval()
    cfg, params, _ = load_model(str(out))
    from sweet_jax import models

    ours = np.asarray(models.forward(params, cfg, tokens))
    for name, theirs, tol in (("peft", hf_logits(adapted, tokens), peft_tol),
                              ("merged", hf_logits(merged, tokens), 1e-4)):
        assert np.abs(ours - theirs).max() <= tol and (ours.argmax(-1) == theirs.argmax(-1)).all(), (
            name, np.abs(ours - theirs).max())
    assert np.abs(hf_logits(adapted, tokens) - hf_logits(base, tokens)).max() > 1e-3  # the adapter changes the model
    # the pipeline's vLLM backend finds the base and the adapter behind the run's export
    from sweet_jax.inference.backends import lora_export

    assert lora_export(str(out / "hf")) == (str(base_dir), str(out / "adapter"))
    assert lora_export(str(base_dir)) is None


def test_the_pipeline_passes_its_lora_settings_to_every_fine_tuning_stage_but_the_score_head_critics():
    import types

    import ml_collections

    from sweet_jax.runs.pipeline_config import load_pipeline_config
    from sweet_jax.pipelines.shared_stages import lora_overrides
    from sweet_jax.training.defaults import derived_from

    cfg = derived_from(os.path.join(os.path.dirname(__file__), "..", "configs", "x.py"), "sweet_backend_tiny.py")
    run = types.SimpleNamespace(cfg=load_pipeline_config(cfg))
    assert lora_overrides(run, ("train.epochs=2",)) == []  # rank 0: full fine-tuning, as before
    cfg.lora.rank = 8
    run = types.SimpleNamespace(cfg=load_pipeline_config(cfg))
    assert lora_overrides(run, ("train.epochs=2",)) == [
        "lora.rank=8", "lora.alpha=16.0", "lora.dropout=0.0",
        "lora.targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]
    for head in cfg.critic_head.overrides, cfg.critic_value.overrides:  # a new score head: trained in full
        assert lora_overrides(run, (*cfg.critic.overrides, *head)) == []
    older = load_pipeline_config(ml_collections.ConfigDict(dict(run_dir="runs/x")))
    assert lora_overrides(types.SimpleNamespace(cfg=older), ()) == []  # an older run's config
