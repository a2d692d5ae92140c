"""Training steps on device meshes: the same numbers as one device, and every big weight actually split."""

import sys
import textwrap

import budget
import numpy as np
import pytest
from multidevice import run_processes, run_with_devices

STEP_PRELUDE = """
    import jax, jax.numpy as jnp, numpy as np, ml_collections
    from sweet_jax import models
    from sweet_jax.parallel import sharding
    from sweet_jax.training import steps
    from sweet_jax.training.optim import make_optimizer
    from sweet_jax.training.partitioning import Layout

    cfg = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                                    num_heads=4, num_kv_heads=2)
    params0 = models.init_params(cfg, jax.random.key(0), std=0.1)
    rng = np.random.default_rng(0)
    B, T, S = 8, 32, 12  # 4 pairs: chosen rows 0-3, rejected rows 4-7
    lengths = rng.integers(20, T + 1, B)
    segment_ids = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    gather_pos = np.stack([np.sort(rng.choice(np.arange(1, n), S, replace=False)) for n in lengths]).astype(np.int32)
    batch = {
        "tokens": rng.integers(0, 512, (B, T)).astype(np.int32) * segment_ids,
        "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)) * segment_ids,
        "segment_ids": segment_ids, "gather_pos": gather_pos,
        "gather_score": rng.random((B, S)) < 0.8, "gather_nll": rng.random((B, S)) < 0.5,
        "gather_turn": np.sort(rng.integers(0, 3, (B, S)), axis=1).astype(np.int32),
        "ref": rng.normal(-6.0, 0.3, B).astype(np.float32),
    }
    # Adam divides each gradient by its own scale, so a rounding difference in a near-zero gradient moves its update by
    # up to lr: a small lr keeps that under the tolerance, while a wrong gradient direction still moves params ~lr.
    # grad_norm (below) catches a wrong gradient scale, which Adam would hide.
    optim = ml_collections.ConfigDict(dict(lr=1e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, clip=1.0,
                                           warmup_frac=0.5, min_lr_ratio=0.1))
"""

STEP_EQUIVALENCE = STEP_PRELUDE + """
    worst = {}
    for objective, reduction, nll_coef in (("critic", "trajectory_mean", 0.0), ("dpo", "turn_mean_sum", 0.01)):
        loss_kw = dict(objective=objective, model_cfg=cfg, chunk=8,
                       loss_cfg=ml_collections.ConfigDict(dict(beta=0.5, reduction=reduction, nll_coef=nll_coef)))
        tx = make_optimizer(optim, 4, 1)  # 2 steps: the first under warmup lr 0 only fills the moments

        def run(step, put_state=lambda s: s, put_batch=lambda b: b):
            state = put_state({"params": jax.tree.map(jnp.copy, params0), "opt_state": tx.init(params0),
                               "step": jnp.zeros((), jnp.int32)})
            losses = []
            for _ in range(2):
                state, metrics = step(state, put_batch(batch))
                losses += [float(metrics["loss"]), float(metrics["grad_norm"])]
            return state, losses

        ref_state, ref_losses = run(steps.make_train_step(tx, **loss_kw))
        moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(ref_state["params"]),
                                                                 jax.tree.leaves(params0)))
        assert moved > 5e-5, moved  # the second step really updates the params
        # the three meshes, and (2, 2, 2) with sequence parallelism (the residual stream split over tensor)
        for shape, rules in (((2, 2, 2), ""), ((1, 8, 1), ""), ((8, 1, 1), ""), ((2, 2, 2), "act_seq=tensor")):
            layout = Layout(sharding.make_mesh(shape), cfg, tx, rules=sharding.parse_rules(rules))
            state, losses = run(layout.train_step(**loss_kw), layout.put_state, layout.put_batch)
            np.testing.assert_allclose(losses, ref_losses, atol=1e-5, rtol=1e-5)
            diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(state["params"]),
                                                                    jax.tree.leaves(ref_state["params"])))
            assert diff <= 1e-5, (objective, shape, diff)
            wq = state["params"]["layers"]["wq"].sharding.spec
            mu = state["opt_state"][1][0].mu["layers"]["wq"].sharding.spec
            assert wq == mu, (wq, mu)  # Adam moments lie like their params
            worst[(objective, shape, rules)] = (diff, str(wq))
    for k, v in worst.items():
        print("EQUIV", k, v)
"""


@pytest.mark.slow
def test_critic_and_dpo_steps_match_one_device_on_three_meshes():
    out = run_with_devices(STEP_EQUIVALENCE)
    lines = [line for line in out.splitlines() if line.startswith("EQUIV")]
    assert len(lines) == 8, out
    assert "P(None, 'fsdp', 'tensor', None)" in out  # (2, 2, 2): wq split over fsdp and tensor
    assert "P(None, 'fsdp', None, None)" in out  # fsdp=8


LORA_STEP_EQUIVALENCE = STEP_PRELUDE + """
    from sweet_jax.models import lora
    # adapters on a frozen bf16 base: the reference in the step with the adapters off (critic), adapter dropout (dpo)
    lcfg = cfg.replace(param_dtype="bfloat16", lora=models.model_configs.LoraSettings(
        rank=4, alpha=8.0, dropout=0.25, targets=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj")))
    params0 = {**jax.tree.map(lambda x: x.astype(jnp.bfloat16), params0),
               "lora": lora.init_adapters(lcfg, lcfg.lora, jax.random.key(1))}
    freeze = tuple(k for k in params0 if k != "lora")
    for objective, in_step, dropout_seed in (("critic", True, None), ("dpo", False, 3), ("dpo", False, None)):
        loss_kw = dict(objective=objective, model_cfg=lcfg, chunk=8, reference_in_step=in_step,
                       loss_cfg=ml_collections.ConfigDict(dict(beta=0.5, reduction="trajectory_mean", nll_coef=0.01)))
        tx = make_optimizer(optim, 4, 1)

        def run(step, put_state=lambda s: s, put_batch=lambda b: b):
            state = put_state({"params": jax.tree.map(jnp.copy, params0),
                               "opt_state": tx.init({"lora": params0["lora"]}), "step": jnp.zeros((), jnp.int32)})
            losses = []
            for _ in range(2):
                state, metrics = step(state, put_batch(batch))
                losses += [float(metrics["loss"]), float(metrics["grad_norm"])]
            return state, losses

        ref_state, ref_losses = run(steps.make_train_step(tx, freeze, dropout_seed=dropout_seed, **loss_kw))
        moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(ref_state["params"]["lora"]),
                                                                 jax.tree.leaves(params0["lora"])))
        assert moved > 4e-5, moved  # the second step's lr is 5e-5, and Adam's first update is about lr in size
        for shape in ((2, 2, 2), (1, 8, 1)):
            layout = Layout(sharding.make_mesh(shape), lcfg, tx, freeze)
            state, losses = run(layout.train_step(dropout_seed=dropout_seed, **loss_kw), layout.put_state,
                                layout.put_batch)
            np.testing.assert_allclose(losses, ref_losses, atol=1e-5, rtol=1e-5)
            diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(state["params"]["lora"]),
                                                                    jax.tree.leaves(ref_state["params"]["lora"])))
            assert diff <= 1e-5, (objective, shape, diff)
            for a, b in zip(jax.tree.leaves(lora.base_of(state["params"])), jax.tree.leaves(lora.base_of(params0))):
                assert a.dtype == jnp.bfloat16 and np.array_equal(np.asarray(a), np.asarray(b))  # the base is fixed
            assert set(state["opt_state"][1][0].mu) == {"lora"}  # Adam state for the adapters alone
            wq = state["params"]["layers"]["wq"].sharding.spec
            ab = state["params"]["lora"]["layers"]["wq"]
            print("LORA", objective, dropout_seed, shape, diff, wq, ab["a"].sharding.spec, ab["b"].sharding.spec,
                  ref_losses[1])  # the first step's gradient norm (B = 0: its loss is the base's, dropout or not)
"""


@pytest.mark.slow
def test_lora_steps_on_a_frozen_bf16_base_match_one_device():
    """Adapters trained on 8 fake devices equal one device's to 1e-5 (critic with the reference in the step, DPO with
    and without adapter dropout); the bf16 base is left bit for bit, and only the adapters have Adam state."""
    out = run_with_devices(LORA_STEP_EQUIVALENCE)
    lines = [line.split() for line in out.splitlines() if line.startswith("LORA")]
    assert len(lines) == 6, out
    assert "P(None, 'fsdp', 'tensor', None) P(None, 'fsdp', None) P(None, None, 'tensor', None)" in out, out
    with_dropout = [float(x[-1]) for x in lines if x[1] == "dpo" and x[2] == "3"]
    without = [float(x[-1]) for x in lines if x[1] == "dpo" and x[2] == "None"]
    assert abs(with_dropout[0] - without[0]) > 1e-3 * without[0]  # the dropout masks change the gradient


COVERAGE = """
    import jax, numpy as np, optax
    from sweet_jax import models
    from sweet_jax.parallel import sharding
    from sweet_jax.training.partitioning import Layout

    cfg = models.LlamaConfig.preset("llama3.1-8b")
    tx = optax.adamw(1e-6)
    layout = Layout(sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 1}), cfg, tx)
    state = layout.abstract_state()
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    big = 0
    for path, leaf in leaves:
        nbytes = int(np.prod(leaf.shape)) * leaf.dtype.itemsize
        if nbytes > 1 << 20:
            big += 1
            assert not leaf.sharding.is_fully_replicated, (jax.tree_util.keystr(path), leaf.shape)
            per_device = leaf.sharding.shard_shape(leaf.shape)
            assert int(np.prod(per_device)) * 8 == int(np.prod(leaf.shape)), (jax.tree_util.keystr(path), per_device)
    print("BIG", big)
"""


def test_8b_state_under_fsdp8_leaves_no_big_weight_replicated():
    out = run_with_devices(COVERAGE)
    # 9 params over 1 MiB (embed, lm_head and the 7 stacked layer matrices) and their two Adam moments each
    assert "BIG 27" in out, out


def test_each_host_builds_only_its_rows_of_a_batch():
    """Two processes x 4 devices: each holds half the rows of a (data=2, fsdp=2, tensor=2) batch, and the global
    array assembled from the halves is the whole batch."""
    code = """
        import jax, numpy as np
        from sweet_jax import models
        from sweet_jax.parallel import distributed, sharding
        from sweet_jax.training.optim import make_optimizer
        from sweet_jax.training.partitioning import Layout
        from sweet_jax.training.defaults import base_config
        assert distributed.initialize()
        cfg = models.LlamaConfig.preset("tiny")
        layout = Layout(sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}), cfg,
                        make_optimizer(base_config().optim, 10, 1))
        full = np.arange(8 * 5, dtype=np.int32).reshape(8, 5)
        rows = layout.process_rows(8)
        batch = layout.put_batch({"tokens": full[rows]}, 8)
        total = jax.jit(lambda x: x.sum(0), out_shardings=layout.replicated)(batch["tokens"])
        print("ROWS", jax.process_index(), rows.tolist(), np.asarray(total).tolist(), flush=True)
    """
    procs = run_processes([sys.executable, "-c", textwrap.dedent(code)], timeout=budget.time_left())
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    lines = sorted(line for p in procs for line in p.stdout.splitlines() if line.startswith("ROWS"))
    expect = np.arange(40).reshape(8, 5).sum(0).tolist()
    assert lines == [f"ROWS 0 [0, 1, 2, 3] {expect}", f"ROWS 1 [4, 5, 6, 7] {expect}"]
