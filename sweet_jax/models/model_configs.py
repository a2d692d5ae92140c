"""The configs of the model families, frozen descriptions of a model and how to run it: `LlamaConfig` (Llama-3.x),
`Qwen2Config` (Qwen2, Qwen2.5: the same decoder with biases on the query, key and value projections) and
`Qwen2VLConfig` (Qwen2-VL: that decoder with multimodal RoPE, and its vision tower's `VisionConfig`).

Architecture fields mirror HF `config.json`; the execution fields at the end (dtypes, remat policy, attention
implementation) are ours and never come from a checkpoint. The dataclasses are frozen and hashable, so a config can be
a static argument to `jax.jit`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "qkv_proj")
ATTENTION_IMPLS = ("auto", "reference", "xla", "cudnn", "splash")
DTYPES = ("float32", "bfloat16", "float16")
# jax's matmul precision for the model's products: "auto" is "float32" (true f32, never TF32) where the compute dtype is
# f32, and the device default otherwise (bf16 operands are multiplied as bf16 with f32 accumulation either way);
# "tensorfloat32" trades f32 accuracy for TF32 speed on NVIDIA GPUs from Ampere
MATMUL_PRECISIONS = ("auto", "default", "tensorfloat32", "float32")


def read_hf_config(path: str | os.PathLike) -> tuple[dict, str]:
    """(the JSON object, its file) of an HF `config.json`: the file, or the directory holding one."""
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file) as fh:
            hf = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{file}: no config.json found") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{file}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{file}: expected a JSON object")
    return hf, file


class ConfigError(ValueError):
    """A config.json (or a preset override) that sweet_jax cannot run faithfully."""


# LoRA's target names, as PEFT names them (the HF module names), in the decoder's order
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """Low-rank adapters on some of the decoder's projections (`models.lora`): W' = W + (alpha / rank) A B, with
    dropout on the adapters' input during training. An execution setting: the checkpoint is the base model."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self):
        names = self.targets.split(",") if isinstance(self.targets, str) else self.targets
        targets = [t.strip() for t in names if t.strip()]
        if not targets or len(set(targets)) != len(targets) or not set(targets) <= set(LORA_TARGETS):
            raise ConfigError(f"LoRA targets must be distinct names among {', '.join(LORA_TARGETS)}, got {targets}")
        if self.rank < 1 or not 0 <= self.dropout < 1:
            raise ConfigError(f"LoRA rank must be >= 1 and dropout in [0, 1), got rank={self.rank}, "
                              f"dropout={self.dropout}")
        object.__setattr__(self, "targets", tuple(t for t in LORA_TARGETS if t in targets))  # the decoder's order

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 ('llama3') frequency-dependent RoPE scaling."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    model_type: ClassVar[str] = "llama"  # HF config.json's model_type; its family in `models.families`
    hf_prefix: ClassVar[str] = "Llama"  # HF class names: {prefix}ForCausalLM, {prefix}ForSequenceClassification

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # None -> hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2), none on the output projection
    bos_token_id: int | None = 128000
    eos_token_id: int | tuple[int, ...] | None = 128001
    # A scalar linear head on the final hidden state instead of the LM head: HF `LlamaForSequenceClassification`
    # with one label (`score.weight`). The regression-head and value-function critics use it.
    score_head: bool = False
    pad_token_id: int | None = None  # HF's sequence classifier pools at the last token that is not this one
    # --- execution settings (not part of the checkpoint) ---
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat_policy: str = "none"
    attention_impl: str = "auto"
    matmul_precision: str = "auto"  # MATMUL_PRECISIONS
    # low-rank adapters (`models.lora`): the params then hold a "lora" entry, trained while the rest stays fixed
    lora: LoraSettings | None = None

    def __post_init__(self):
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; set head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        for name, allowed in (
            ("param_dtype", DTYPES),
            ("compute_dtype", DTYPES),
            ("remat_policy", REMAT_POLICIES),
            ("attention_impl", ATTENTION_IMPLS),
            ("matmul_precision", MATMUL_PRECISIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r}; expected one of {allowed}")

    # ------------------------------------------------------------------ derived
    @property
    def precision(self) -> str:
        """The matmul precision jax runs the model's products at (`matmul_precision`, "auto" resolved)."""
        if self.matmul_precision != "auto":
            return self.matmul_precision
        return "float32" if self.compute_dtype == "float32" else "default"

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any):
        """dataclasses.replace, except that a head_dim derived from hidden_size // num_heads is derived again."""
        derived = self.head_dim * self.num_heads == self.hidden_size
        if derived and "head_dim" not in changes and ({"hidden_size", "num_heads"} & changes.keys()):
            changes["head_dim"] = None
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        d, f, v, l = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        attn = d * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        bias = self.head_dim * (self.num_heads + 2 * self.num_kv_heads) if self.qkv_bias else 0
        per_layer = attn + bias + 3 * d * f + 2 * d
        head = d if self.score_head else (0 if self.tie_word_embeddings else v * d)
        return v * d + head + l * per_layer + d

    def train_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of one training token (forward + backward = 3 x forward) in a causal sequence of `seq_len`
        tokens: 6 per matmul weight (the LM head included, the embedding lookup not) plus causal attention, whose
        scores and weighted values cost 2 x 2 x heads x head_dim x (seq_len / 2) per token forward. The MFU
        numerator: recomputation (remat) is not counted."""
        d, f, l = self.hidden_size, self.intermediate_size, self.num_layers
        matmul = l * (d * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads) + 3 * d * f) + d * self.vocab_size
        attention = l * 2 * self.num_heads * self.head_dim * seq_len
        return 6.0 * matmul + 3.0 * attention

    # ------------------------------------------------------------------ presets
    @classmethod
    def preset(cls, name: str, **overrides: Any):
        try:
            base = PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None
        return base.replace(**overrides)

    # ------------------------------------------------------------------ HF I/O
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any):
        """Read an HF `config.json` (a file, or the directory holding one). Unsupported settings raise ConfigError."""
        hf, file = read_hf_config(path)
        return cls.from_hf_dict(hf, source=file, **overrides)

    @classmethod
    def from_hf_dict(cls, hf: dict, source: str = "<config>", **overrides: Any):
        def fail(field: str, msg: str):
            raise ConfigError(f"{source}: field '{field}': {msg}")

        if hf.get("model_type", cls.model_type) != cls.model_type:
            fail("model_type", f"{hf.get('model_type')!r} is not {cls.__name__}'s {cls.model_type!r}")
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if field not in hf:
                fail(field, "missing")
        if hf.get("hidden_act", "silu") != "silu":
            fail("hidden_act", f"{hf['hidden_act']!r} is not supported (only 'silu')")
        cls._check_hf(hf, fail)

        # transformers >= 5 nests RoPE settings under `rope_parameters`; published Llama-3 configs use
        # `rope_theta` + `rope_scaling`. Accept both.
        rope = dict(hf.get("rope_parameters") or {})
        rope_field = "rope_parameters" if rope else "rope_scaling"
        if not rope:
            rope = dict(hf.get("rope_scaling") or {})
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            try:
                scaling = RopeScaling(
                    factor=float(rope["factor"]),
                    low_freq_factor=float(rope["low_freq_factor"]),
                    high_freq_factor=float(rope["high_freq_factor"]),
                    original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
                )
            except KeyError as e:
                fail(f"{rope_field}.{e.args[0]}", "missing (required for rope_type 'llama3')")
            if scaling.high_freq_factor == scaling.low_freq_factor:
                fail(f"{rope_field}.high_freq_factor", "must differ from low_freq_factor")
        elif rope_type != "default":
            fail(f"{rope_field}.rope_type", f"{rope_type!r} is not supported (supported: 'default', 'llama3')")
        if rope.get("attention_factor") not in (None, 1.0):
            fail(f"{rope_field}.attention_factor", "only 1.0 is supported")

        archs = hf.get("architectures") or [f"{cls.hf_prefix}ForCausalLM"]
        score_head = f"{cls.hf_prefix}ForSequenceClassification" in archs
        if score_head and len(hf.get("id2label") or {"0": "LABEL_0"}) != 1:
            fail("id2label", f"{len(hf['id2label'])} labels; a score head needs exactly one (a scalar value)")
        heads = int(hf["num_attention_heads"])
        kw = dict(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=hf.get("head_dim"),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=cls._hf_qkv_bias(hf),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            score_head=score_head,
            pad_token_id=hf.get("pad_token_id"),
        )
        kw.update(overrides)
        try:
            return cls(**kw)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def _check_hf(cls, hf: dict, fail) -> None:
        """Refuse the config.json settings of this family that the implementation does not run."""
        for flag in ("attention_bias", "mlp_bias"):
            if hf.get(flag):
                fail(flag, "biases are not supported by the Llama-3 architecture implemented here")

    @classmethod
    def _hf_qkv_bias(cls, hf: dict) -> bool:
        return False

    def to_hf_dict(self) -> dict:
        hf: dict[str, Any] = {
            "architectures": [f"{self.hf_prefix}ForCausalLM"],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "torch_dtype": self.param_dtype,
        }
        if self.pad_token_id is not None:
            hf["pad_token_id"] = self.pad_token_id
        if self.score_head:
            hf.update(architectures=[f"{self.hf_prefix}ForSequenceClassification"], id2label={"0": "LABEL_0"},
                      label2id={"LABEL_0": 0})
        if self.rope_scaling is not None:
            hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        return hf


@dataclasses.dataclass(frozen=True)
class Qwen2Config(LlamaConfig):
    """Qwen2 / Qwen2.5 (HF `Qwen2ForCausalLM`): the Llama decoder with biases on q, k and v (none on o), RoPE
    theta 1e6, and full attention in every layer (the sliding-window variant is refused)."""

    model_type: ClassVar[str] = "qwen2"
    hf_prefix: ClassVar[str] = "Qwen2"

    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    qkv_bias: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = 151645  # <|im_end|>

    @classmethod
    def _check_hf(cls, hf: dict, fail) -> None:
        if hf.get("use_sliding_window"):
            fail("use_sliding_window", "sliding-window attention is not supported (every layer attends fully)")
        if any(t != "full_attention" for t in hf.get("layer_types") or ()):
            fail("layer_types", "only 'full_attention' layers are supported")

    @classmethod
    def _hf_qkv_bias(cls, hf: dict) -> bool:
        return True  # Qwen2Attention always has q, k and v biases

    def __post_init__(self):
        super().__post_init__()
        if not self.qkv_bias:
            raise ConfigError("qkv_bias=False: Qwen2 always has biases on q, k and v")

    def to_hf_dict(self) -> dict:
        hf = super().to_hf_dict()
        del hf["attention_bias"], hf["mlp_bias"]
        hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_layers)
        return hf


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """HF `Qwen2VLVisionConfig` (config.json's `vision_config`)."""

    depth: int = 32
    embed_dim: int = 1280
    hidden_size: int = 3584  # the language model's width: the merger's output
    mlp_ratio: float = 4.0
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    rope_theta: float = 10000.0  # the 2-D RoPE inside the tower (fixed in HF)
    compute_dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_dim(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def num_params(self) -> int:
        e, f, m = self.embed_dim, self.mlp_dim, self.embed_dim * self.spatial_merge_size ** 2
        block = 4 * e + 3 * e * e + 3 * e + e * e + e + 2 * e * f + f + e
        return self.patch_dim * e + self.depth * block + 2 * e + m * m + m + m * self.hidden_size + self.hidden_size

    def to_hf_dict(self) -> dict:
        ratio = int(self.mlp_ratio) if float(self.mlp_ratio).is_integer() else self.mlp_ratio  # HF's is an int
        return {"depth": self.depth, "embed_dim": self.embed_dim, "hidden_size": self.hidden_size,
                "mlp_ratio": ratio, "num_heads": self.num_heads, "in_channels": self.in_channels,
                "patch_size": self.patch_size, "temporal_patch_size": self.temporal_patch_size,
                "spatial_merge_size": self.spatial_merge_size, "hidden_act": "quick_gelu"}

    @classmethod
    def from_hf_dict(cls, hf: dict, source: str = "<config>") -> "VisionConfig":
        def fail(field, msg):
            raise ConfigError(f"{source}: field 'vision_config.{field}': {msg}")

        if hf.get("hidden_act", "quick_gelu") != "quick_gelu":
            fail("hidden_act", f"{hf['hidden_act']!r} is not supported (only 'quick_gelu')")
        rope = hf.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            fail("rope_parameters.rope_type", f"{rope['rope_type']!r} is not supported (only 'axial')")
        embed = int(hf.get("embed_dim", 1280))
        if embed % int(hf.get("num_heads", 16)):
            fail("num_heads", f"does not divide embed_dim={embed}")
        return cls(depth=int(hf.get("depth", 32)), embed_dim=embed, hidden_size=int(hf.get("hidden_size", 3584)),
                   mlp_ratio=float(hf.get("mlp_ratio", 4.0)), num_heads=int(hf.get("num_heads", 16)),
                   in_channels=int(hf.get("in_channels", hf.get("in_chans", 3))),
                   patch_size=int(hf.get("patch_size", 14)),
                   temporal_patch_size=int(hf.get("temporal_patch_size", 2)),
                   spatial_merge_size=int(hf.get("spatial_merge_size", 2)),
                   rope_theta=float(rope.get("rope_theta", 10000.0)))

@dataclasses.dataclass(frozen=True)
class Qwen2VLConfig(Qwen2Config):
    """Qwen2-VL (HF `Qwen2VLForConditionalGeneration`): the Qwen2 decoder with multimodal RoPE (`mrope_section`:
    how many of each head's frequencies turn by the temporal, height and width positions), and a vision tower
    (`vision`) whose image features replace the `<|image_pad|>` tokens' embeddings (`models.qwen2_vl`).

    Reads both config.json layouts: transformers >= 5 nests the decoder under `text_config` with the sections in
    `rope_parameters`; the published checkpoints keep it at the top level with `rope_scaling: {type: mrope}`."""

    model_type: ClassVar[str] = "qwen2_vl"
    hf_prefix: ClassVar[str] = "Qwen2VL"

    mrope_section: tuple[int, ...] = (16, 24, 24)
    vision: VisionConfig = VisionConfig()
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    eos_token_id: int | tuple[int, ...] | None = 151645

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "mrope_section", tuple(int(s) for s in self.mrope_section))
        if sum(self.mrope_section) != self.head_dim // 2:
            raise ConfigError(f"mrope_section={list(self.mrope_section)} sums to {sum(self.mrope_section)}, not "
                              f"head_dim // 2 = {self.head_dim // 2}")
        if self.vision.hidden_size != self.hidden_size:
            raise ConfigError(f"vision_config.hidden_size={self.vision.hidden_size} is not the decoder's "
                              f"hidden_size={self.hidden_size}")
        if self.vision.compute_dtype != self.compute_dtype:  # one compute dtype for the tower and the decoder
            object.__setattr__(self, "vision", dataclasses.replace(self.vision, compute_dtype=self.compute_dtype))

    def num_params(self) -> int:
        return super().num_params() + self.vision.num_params()

    @classmethod
    def from_hf_dict(cls, hf: dict, source: str = "<config>", **overrides: Any):
        def fail(field: str, msg: str):
            raise ConfigError(f"{source}: field '{field}': {msg}")

        if hf.get("model_type") != cls.model_type:
            fail("model_type", f"{hf.get('model_type')!r} is not {cls.__name__}'s {cls.model_type!r}")
        nested = "text_config" in hf
        text = {k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}
        text.update(hf.get("text_config") or {})
        text["model_type"] = Qwen2Config.model_type
        rope_field = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
        rope = dict(text.get(rope_field) or {})
        if "mrope_section" not in rope:
            fail(f"{'text_config.' if nested else ''}{rope_field}.mrope_section", "missing")
        section = tuple(int(s) for s in rope.pop("mrope_section"))
        if rope.get("type") == "mrope":  # the published layout names its RoPE "mrope"; the frequencies are default
            rope["type"] = "default"
        text[rope_field] = rope
        vision = VisionConfig.from_hf_dict(hf.get("vision_config") or {}, source)
        archs = [a.replace("ForConditionalGeneration", "ForCausalLM").replace(cls.hf_prefix, Qwen2Config.hf_prefix)
                 for a in hf.get("architectures") or ()]  # a score head: ours, Qwen2VLForSequenceClassification
        text["architectures"] = archs or None
        ids = {k: int(hf[k]) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                       "vision_end_token_id") if hf.get(k) is not None}
        base = Qwen2Config.from_hf_dict(text, source)
        kw = {f.name: getattr(base, f.name) for f in dataclasses.fields(Qwen2Config)}
        kw.update(mrope_section=section, vision=vision, **ids)
        # HF ties from the outer config, or from text_config as configs saved before transformers 5 say
        kw["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings") or (hf.get("text_config") or {}).get(
            "tie_word_embeddings"))
        kw.update(overrides)
        try:
            return cls(**kw)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    def to_hf_dict(self) -> dict:
        """transformers >= 5's layout: the decoder under `text_config`."""
        text = super().to_hf_dict()
        outer = {k: text.pop(k) for k in ("architectures", "torch_dtype", "tie_word_embeddings")}
        outer.update({k: text.pop(k) for k in ("id2label", "label2id") if k in text})
        outer["architectures"] = [a.replace("ForCausalLM", "ForConditionalGeneration") for a in outer["architectures"]]
        text.update(model_type="qwen2_vl_text", rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta,
                                                                 "mrope_section": list(self.mrope_section)})
        del text["rope_theta"], text["rope_scaling"]
        return {**outer, "model_type": self.model_type, "text_config": text, "vision_config": self.vision.to_hf_dict(),
                "image_token_id": self.image_token_id, "video_token_id": self.video_token_id,
                "vision_start_token_id": self.vision_start_token_id, "vision_end_token_id": self.vision_end_token_id}


_LLAMA31_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
_LLAMA32_ROPE = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
_LLAMA3_COMMON = dict(
    vocab_size=128256,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    bos_token_id=128000,
    eos_token_id=(128001, 128008, 128009),
)

# Published dimensions (meta-llama/* config.json).
PRESETS: dict[str, LlamaConfig] = {
    "llama3.1-8b": LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
        rope_scaling=_LLAMA31_ROPE, **_LLAMA3_COMMON),
    "llama3.1-70b": LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64, num_kv_heads=8,
        rope_scaling=_LLAMA31_ROPE, **_LLAMA3_COMMON),
    "llama3.1-405b": LlamaConfig(
        hidden_size=16384, intermediate_size=53248, num_layers=126, num_heads=128, num_kv_heads=8,
        rope_scaling=_LLAMA31_ROPE, **_LLAMA3_COMMON),
    "llama3.2-1b": LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
        rope_scaling=_LLAMA32_ROPE, tie_word_embeddings=True, **_LLAMA3_COMMON),
    "llama3.2-3b": LlamaConfig(
        hidden_size=3072, intermediate_size=8192, num_layers=28, num_heads=24, num_kv_heads=8, head_dim=128,
        rope_scaling=_LLAMA32_ROPE, tie_word_embeddings=True, **_LLAMA3_COMMON),
    # A tiny random model for smoke runs and the default offline job; vocab matches the Llama-3 tokenizer.
    "tiny": LlamaConfig(
        vocab_size=128256, hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4, num_kv_heads=2,
        rope_theta=500000.0, rope_scaling=_LLAMA31_ROPE, max_position_embeddings=131072,
        bos_token_id=128000, eos_token_id=(128001, 128008, 128009)),
    # Published dimensions (Qwen/* config.json).
    "qwen2-0.5b": Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
        max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645),
    "qwen2-7b": Qwen2Config(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
        max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151645),
    "qwen2-72b": Qwen2Config(
        vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_layers=80, num_heads=64, num_kv_heads=8,
        max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151645),
    "qwen2-tiny": Qwen2Config(
        vocab_size=151936, hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4, num_kv_heads=2,
        max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645),
    # Published dimensions (Qwen/Qwen2-VL-*-Instruct config.json).
    "qwen2-vl-2b": Qwen2VLConfig(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
        max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=151643,
        vision=VisionConfig(hidden_size=1536)),
    "qwen2-vl-7b": Qwen2VLConfig(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
        max_position_embeddings=32768, bos_token_id=151643, vision=VisionConfig(hidden_size=3584)),
    "qwen2-vl-72b": Qwen2VLConfig(
        vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_layers=80, num_heads=64, num_kv_heads=8,
        max_position_embeddings=32768, bos_token_id=151643, vision=VisionConfig(hidden_size=8192)),
    "qwen2-vl-tiny": Qwen2VLConfig(
        vocab_size=151936, hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4, num_kv_heads=2,
        max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=151643, mrope_section=(2, 2, 4),
        vision=VisionConfig(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2.0)),
}
