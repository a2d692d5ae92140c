"""Opening a model: the job config of a model section (`model_config`), and `load_model`, which opens whatever a
user points at, an HF checkpoint directory or a training run of `sweet_jax.train` (its latest Orbax checkpoint), with
the tokenizer that goes with it (`LoadedModel.tokenizer`: the one given, else the model's own, else the bundled
tokenizer of its chat format)."""

from __future__ import annotations

import json
import logging
import os
from typing import NamedTuple

from sweet_jax import chat
from sweet_jax.files.hub import local_model
from sweet_jax.models import kernel_choice, llama, lora
from sweet_jax.models.model_configs import ConfigError, LoraSettings
from sweet_jax.models.families import family_of, load_config, preset
from sweet_jax.models.hf_checkpoint import load_hf_params
from sweet_jax.models.settings import AdapterSettings, ModelSettings

log = logging.getLogger("sweet_jax.models")


class ModelLoadError(RuntimeError):
    """A model directory that is neither an HF checkpoint nor a finished training run."""


def lora_settings(section) -> LoraSettings | None:
    """A job's `lora` settings (`settings.AdapterSettings`, or a mapping of them) as `LoraSettings`; None when
    absent or rank 0 (no adapters)."""
    section = AdapterSettings.of(section)
    if not section.rank:
        return None
    return LoraSettings(rank=section.rank, alpha=section.alpha, dropout=section.dropout, targets=section.targets)


def model_config(model_cfg, *, score_head: bool = False, tokenizer: str | None = None, lora=None):
    """The model config of a job's `model` settings (see `training.defaults`): the checkpoint's config.json
    (`model.hf_path`) or a preset (`model.preset`, `model.preset_overrides`), with the execution settings (dtypes,
    remat policy, attention implementation, and the job's `lora` section's adapters). `score_head` puts a scalar
    score head in place of the LM head, whose pad token is looked up in the job's tokenizer (`tokenizer`, else the
    model's, else the bundled one). `model_cfg` is a `settings.ModelSettings` or a mapping of some of them."""
    model_cfg = ModelSettings.of(model_cfg)
    overrides = dict(param_dtype=model_cfg.param_dtype, compute_dtype=model_cfg.compute_dtype,
                     remat_policy=model_cfg.remat_policy, attention_impl=model_cfg.attention_impl,
                     matmul_precision=model_cfg.matmul_precision, score_head=score_head, lora=lora_settings(lora))
    if model_cfg.hf_path:
        model_cfg = local_section(model_cfg)
        if not os.path.isdir(model_cfg.hf_path):
            raise ConfigError(
                f"model directory {model_cfg.hf_path!r} not found. Give a Hub id (for the 8B recipes: "
                f"--config.model.hf_path=meta-llama/Llama-3.1-8B-Instruct, downloaded into the Hub cache) or the "
                f"directory of a downloaded checkpoint.")
        cfg = load_config(model_cfg.hf_path, **overrides)
    else:
        cfg = preset(model_cfg.preset, **overrides, **dict(model_cfg.preset_overrides))
    chat_format = family_of(cfg).chat_format
    token = chat.get_format(chat_format).score_pad_token
    if cfg.score_head and cfg.pad_token_id is None and token is not None:
        # exported for HF / vLLM, a batched sequence classifier pools at the last token that is not the pad token,
        # so the pad must be a token that never occurs in text
        hf_path = model_cfg.hf_path
        try:
            pad = chat.special_token_id(chat.tokenizer_dir(
                tokenizer, hf_path if hf_path and chat.has_tokenizer(hf_path) else None, chat_format=chat_format), token)
        except FileNotFoundError:  # no tokenizer at hand (a memory plan on a laptop): no pad to export
            pad = None
        if pad is not None and pad < cfg.vocab_size:
            cfg = cfg.replace(pad_token_id=pad)
    try:  # an attention kernel the device cannot run: said now, before any data is read
        kernel_choice.attention_impl(cfg.attention_impl, cfg.compute_dtype, head_dim=cfg.head_dim)
    except kernel_choice.KernelUnsupported as e:
        raise ConfigError(f"model.attention_impl: {e}") from None
    return cfg


class LoadedModel(NamedTuple):
    cfg: object  # the model config (`models.ModelConfig`)
    params: dict
    tokenizer_dir: str | None  # the tokenizer that came with the model, if any

    @property
    def chat_format(self) -> str:
        """The model family's chat format: what a tokenizer without a chat template of its own gets."""
        return family_of(self.cfg).chat_format

    def chat_format_for(self, tokenizer, name: str | None = None):
        """The `chat.ChatFormat` the model uses with `tokenizer` (`chat.format_for`): the one named, else the
        tokenizer's own template, else the family's format."""
        return chat.format_for(tokenizer, name, self.chat_format)

    def tokenizer(self, override: str | None = None):
        """The tokenizer `override`, else the model's own, else its chat format's bundled one."""
        return chat.find_tokenizer(override, self.tokenizer_dir, chat_format=self.chat_format)


def local_section(section: ModelSettings) -> ModelSettings:
    """A model section whose `hf_path` is a local directory: a Hub id's snapshot in the Hub cache, downloaded first
    unless offline (`files.hub.local_model`)."""
    if not section.hf_path:
        return section
    return section.replace(hf_path=local_model(section.hf_path, "model.hf_path"))


def load_model(path: str, dtype: str = "float32", *, inference_layout: bool = False,
               shardings=None, adapter: str | None = None) -> LoadedModel:
    """The model at `path`: an HF checkpoint directory, a Hub id (`owner/name[@revision]`, from the Hub cache,
    downloaded first unless offline), or a training run directory of `sweet_jax.train` (its latest Orbax checkpoint;
    only the params are restored). `dtype` is the compute dtype; `inference_layout` returns the
    params unstacked, per layer (`models.unstack_layers`), and stored in the compute dtype (bf16 weights for a bf16
    server). `shardings(cfg)` (for example `inference.placement.Placement.stacked_shardings`) gives the shardings of
    the stacked params: each array is then read straight onto its devices.

    Adapters are merged into the weights they adapt (`models.lora`), so the model runs at its base's speed: a LoRA
    training run's (its base, from the run's model settings, plus its checkpoint's adapters), or `adapter`, a PEFT
    LoRA adapter directory on top of an HF checkpoint at `path`."""
    import orbax.checkpoint as ocp

    path = local_model(path)
    if adapter:
        adapter = local_model(adapter, "adapter", needs=("adapter_config.json",))
    if os.path.isdir(os.path.join(path, "checkpoints")) and os.path.exists(os.path.join(path, "config.json")):
        if adapter:
            raise ModelLoadError(f"{path} is a training run; an adapter ({adapter}) goes on an HF checkpoint")
        run_file = os.path.join(path, "config.json")
        with open(run_file) as fh:
            run = json.load(fh)
        section = local_section(ModelSettings.load(run["model"], source=run_file))
        manager = ocp.CheckpointManager(os.path.join(path, "checkpoints"))
        step = manager.latest_step()
        if step is None:
            raise ModelLoadError(f"{path}/checkpoints holds no finished checkpoint")
        cfg = model_config(section, score_head=_has_score_head(os.path.join(path, "checkpoints"), step),
                           tokenizer=run.get("tokenizer_path"), lora=run.get("lora")).replace(compute_dtype=dtype)
        if inference_layout:
            cfg = cfg.replace(param_dtype=dtype)
        place = shardings(cfg) if shardings else None
        abstract = llama.abstract_params(cfg, place)
        if cfg.lora is not None:  # the checkpoint holds the adapters; the base comes from where training took it
            abstract = {"lora": abstract["lora"]}
        params = manager.restore(step, args=ocp.args.PyTreeRestore(item={"params": abstract},
                                                                   partial_restore=True))["params"]
        if cfg.lora is not None:
            base = initial_params(section, cfg.replace(lora=None), lora.base_of(place) if place else None)
            params = lora.merge(base, params["lora"], cfg.lora)
            cfg = cfg.replace(lora=None)
        log.info("loaded %s step %d", path, step)
        tokenizer = run.get("tokenizer_path") or section.hf_path or None
    elif os.path.exists(os.path.join(path, "config.json")):
        cfg = load_config(path, compute_dtype=dtype)
        if inference_layout:
            cfg = cfg.replace(param_dtype=dtype)
        params = load_hf_params(path, cfg, dtype=cfg.param_dtype, shardings=shardings(cfg) if shardings else None,
                                adapter=adapter or None)
        tokenizer = path if chat.has_tokenizer(path) else None
    else:
        raise ModelLoadError(f"{path}: neither an HF checkpoint directory (config.json + *.safetensors) nor a "
                             f"sweet_jax training run (config.json + checkpoints/)")
    return LoadedModel(cfg, llama.unstack_layers(params) if inference_layout else params, tokenizer)


def _has_score_head(checkpoints: str, step: int) -> bool:
    """Whether a training run's checkpoint holds a scalar score head (`score`) in place of the LM head."""
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(checkpoints, item_handlers=ocp.StandardCheckpointHandler())
    return "score" in manager.item_metadata(step)["params"]


def initial_params(model_section, cfg, shardings=None) -> dict:
    """The params a job of `model_section` (`settings.ModelSettings`) starts from, each array built directly in its
    sharding: `hf_path`'s checkpoint, else the random init of `init_seed` and `init_std`; with `cfg.lora`, fresh
    adapters beside the base (B = 0: the model starts as its base)."""
    import jax

    model_section = local_section(ModelSettings.of(model_section))
    if not model_section.hf_path:
        init = jax.jit(llama.init_params, static_argnums=(0, 2), out_shardings=shardings)
        return init(cfg, jax.random.key(model_section.init_seed), model_section.init_std)
    if cfg.lora is None:
        return load_hf_params(model_section.hf_path, cfg, dtype=cfg.param_dtype, shardings=shardings)
    base = load_hf_params(model_section.hf_path, cfg.replace(lora=None), dtype=cfg.param_dtype,
                          shardings=lora.base_of(shardings) if shardings else None)
    init = jax.jit(lora.init_adapters, static_argnums=(0, 1), out_shardings=shardings["lora"] if shardings else None)
    return {**base, "lora": init(cfg, cfg.lora, jax.random.key(model_section.init_seed))}
