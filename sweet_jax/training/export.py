"""A finished job's exports: the final params as an HF checkpoint (+ tokenizer) under `hf/`, ready for vLLM (merged,
for a LoRA run), and a LoRA run's adapters in PEFT's format under `adapter/`."""

from __future__ import annotations

import contextlib
import logging
import os

import jax

from sweet_jax import models
from sweet_jax.files.atomic import atomic_directory
from sweet_jax.models import lora
from sweet_jax.training.job_setup import Job

log = logging.getLogger("sweet_jax.train")


def export_run(job: Job, params: dict) -> None:
    cfg, model_cfg, leader = job.cfg, job.model_cfg, job.leader
    if model_cfg.lora is not None and leader:
        out = os.path.join(job.run_dir, "adapter")
        with atomic_directory(out) as target:
            lora.save_peft_adapter(target, jax.device_get(params["lora"]), model_cfg, model_cfg.lora,
                                   base_model=job.base_model)
            job.tokenizer.save_pretrained(target)
        log.info("exported the LoRA adapter (PEFT's format) to %s", out)
    if cfg.train.export_hf:
        out = os.path.join(job.run_dir, "hf")
        # every process gathers each tensor in turn; process 0 writes, into a directory that appears whole
        with atomic_directory(out) if leader else contextlib.nullcontext(out) as target:
            models.save_hf_params(lora.merged(params, model_cfg), model_cfg.replace(lora=None), target,
                                  dtype=cfg.train.export_dtype or None, write=leader)
            if leader:
                job.tokenizer.save_pretrained(target)
        if leader:
            log.info("exported HF checkpoint to %s", out)
