"""Will it fit? `python -m sweet_jax.plan --config configs/critic_8b.py --mesh fsdp=8 [--hbm-gib 80]`.

Compiles the job's real train step for the mesh on fake CPU devices (abstract shapes, nothing allocated, no
accelerator needed) and prints per-device memory from XLA's memory analysis and the model FLOPs of a step. Exits 1
when the step is over the per-device budget, after naming the remat setting that would fit (or saying none does);
exit 2 for bad input. Config overrides work as in `sweet_jax.train` (`--config.data.max_len=16384`).

    --mesh        axis sizes, e.g. "fsdp=8" or "data=2,fsdp=4,tensor=8"; unnamed axes are 1; default: the config's
                  mesh (a -1 there needs --devices, the device count).
    --seq-len     tokens per sequence (default: data.max_len).
    --turn-len    plan prefix-shared pair rows (critic, dpo): seq-len - turn-len history tokens, two turn-len turns.
    --hbm-gib     per-device memory budget in GiB (default 80: an H100 / A100-80G; an H200 has 141, a TPU v5p 95).
    --json        also write the figures to this file.
    --device      also list the step's kernels on a simulated device (a100, l4, h100, tpu-v5e; exit 1 if one can't run).

Serving (`inference.memory_plan`): `--serve --model llama3.1-70b --mesh tensor=8 --batch 64 --context 16384` plans the
engine's decode step (`--mean-live 4096 [--page-size 128]`: on a paged KV cache for that mean of live tokens per slot;
`--rank 16 --candidate-len 1024`: critic ranking after a --context history); it ends `kv cache: N GiB per device`.
"""

from __future__ import annotations

import os
import sys

from absl import flags
from ml_collections import config_flags

from sweet_jax.cli.app import require_config, run
from sweet_jax.files.atomic import write_json
from sweet_jax.training.planning import (BF16_NOTE, PlanError, fake_cpu_devices, format_plan, parse_mesh,
                                         plan_document)

FLAGS = flags.FLAGS


def serve_main() -> int:
    if not FLAGS.model:
        raise PlanError("--serve needs --model: a preset name (e.g. llama3.1-8b) or an HF directory")
    sizes, devices = parse_mesh(FLAGS.mesh, {}, FLAGS.devices)
    fake_cpu_devices(devices)
    from sweet_jax import models
    from sweet_jax.inference import memory_plan

    try:
        plan = memory_plan.plan_serving(FLAGS.model, sizes, slots=FLAGS.batch, context=FLAGS.context,
                                        rank=FLAGS.rank, candidate_len=FLAGS.candidate_len, dtype=FLAGS.dtype,
                                        mean_live=FLAGS.mean_live, page_size=FLAGS.page_size)
    except (models.ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(memory_plan.format_serve_plan(plan, FLAGS.hbm_gib))
    if FLAGS.json:
        write_json(FLAGS.json, {"mesh": sizes, "hbm_gib": FLAGS.hbm_gib, **plan.as_dict(FLAGS.hbm_gib)}, indent=2)
    return 0 if plan.fits(FLAGS.hbm_gib) else 1


def main(argv) -> int:
    if FLAGS.serve:
        return serve_main()
    from sweet_jax.training.job_config import JobConfig

    cfg = require_config(FLAGS.config, "configs/critic_8b.py --mesh fsdp=8", JobConfig)
    sizes, devices = parse_mesh(FLAGS.mesh, cfg.mesh.to_dict(), FLAGS.devices)
    bf16_params = cfg.model.param_dtype in ("bfloat16", "float16")
    fake_cpu_devices(devices, bf16_params)
    import jax

    from sweet_jax import models
    from sweet_jax.parallel import sharding
    from sweet_jax.training import aot, job_setup

    if jax.device_count() != devices:
        print(f"error: jax started with {jax.device_count()} devices, not {devices} (was it imported before "
              f"sweet_jax.plan set XLA_FLAGS?)", file=sys.stderr)
        return 2
    arch_note = ""
    try:
        if cfg.model.hf_path and not os.path.isdir(cfg.model.hf_path):
            arch_note = f" (preset {cfg.model.preset}: {cfg.model.hf_path} is not here)"
            cfg = cfg.replace(model=cfg.model.replace(hf_path=""))
        model_cfg = job_setup.job_model(cfg)
        seq_len = FLAGS.seq_len or int(cfg.data.max_len)
        mesh = sharding.make_mesh(sizes)
        result = aot.plan_job(cfg, model_cfg, mesh, seq_len, FLAGS.hbm_gib, search=FLAGS.search,
                              turn_len=FLAGS.turn_len)
        if FLAGS.device:  # the kernels the planned step would run there
            result["device_kernels"] = aot.device_kernels(cfg, model_cfg, mesh, result["plan"], FLAGS.device)
    except (models.ConfigError, job_setup.SetupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_plan(result, cfg, model_cfg, sizes, FLAGS.hbm_gib, arch_note))
    if bf16_params:
        print(BF16_NOTE.format(dtype=cfg.model.param_dtype))
    if FLAGS.json:
        write_json(FLAGS.json, plan_document(result, sizes, FLAGS.hbm_gib), indent=2)
    return 0 if result["fits"] and not (result.get("device_kernels") or {}).get("unsupported") else 1


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "A job config file under configs/.", lock_config=True)
    flags.DEFINE_string("mesh", None, 'Mesh axis sizes, e.g. "fsdp=8" or "data=2,fsdp=2,tensor=2".')
    flags.DEFINE_integer("devices", None, "Device count (only needed when the mesh has a -1).")
    flags.DEFINE_integer("seq_len", None, "Tokens per sequence (default: data.max_len).")
    flags.DEFINE_integer("turn_len", 0, "Plan prefix-shared pairs whose two turns have this many tokens each.")
    flags.DEFINE_float("hbm_gib", 80.0, "Per-device memory budget, GiB.")
    flags.DEFINE_string("json", None, "Write the plan as JSON to this path.")
    flags.DEFINE_boolean("search", True, "When over budget, plan the stronger remat policies too.")
    flags.DEFINE_string("device", None, "Also list the step's kernels on this simulated device (a100, l4, h100...).")
    flags.DEFINE_boolean("serve", False, "Plan the serving engine's decode step (or --rank) instead of training.")
    flags.DEFINE_string("model", None, "--serve: a model preset name or an HF directory.")
    flags.DEFINE_integer("batch", 64, "--serve: decode slots.")
    flags.DEFINE_integer("context", 8192, "--serve: tokens per slot (with --rank: the history's length).")
    flags.DEFINE_integer("rank", 0, "--serve: plan critic ranking of this many candidates instead of decoding.")
    flags.DEFINE_integer("candidate_len", 1024, "--serve --rank: tokens per candidate.")
    flags.DEFINE_string("dtype", "bfloat16", "--serve: the weights' and compute dtype.")
    flags.DEFINE_integer("mean_live", None, "--serve: a paged KV cache for this mean of live tokens per slot.")
    flags.DEFINE_integer("page_size", 128, "--serve --mean-live: tokens per KV page.")
    run(main, errors=(PlanError,))
