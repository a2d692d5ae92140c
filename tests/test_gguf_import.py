"""`sweet_jax.import_gguf` on GGUF files written here with the `gguf` package's writer: a llama.cpp-layout Llama (its
query and key rows permuted as llama.cpp's converter does) comes back as the original weights, and unsupported files
are refused naming the file and field."""

import gguf
import jax
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.models import ConfigError
from sweet_jax.models.gguf_import import import_gguf

CFG = models.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                         num_kv_heads=2, rope_theta=10000.0, max_position_embeddings=256, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False)


def _llama_cpp_permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permutation of HF q/k rows (HF half-split -> interleaved rotary pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write(path, arch="llama"):
    params = models.init_params(CFG, jax.random.key(0), std=0.5)
    layout = models.family_of(CFG).hf_weight_layout(CFG)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(CFG.num_layers)
    w.add_context_length(CFG.max_position_embeddings)
    w.add_embedding_length(CFG.hidden_size)
    w.add_feed_forward_length(CFG.intermediate_size)
    w.add_head_count(CFG.num_heads)
    w.add_head_count_kv(CFG.num_kv_heads)
    w.add_layer_norm_rms_eps(CFG.rms_norm_eps)
    w.add_rope_freq_base(CFG.rope_theta)
    w.add_vocab_size(CFG.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    names = {"embed": "token_embd", "final_norm": "output_norm", "lm_head": "output", "attn_norm": "attn_norm",
             "mlp_norm": "ffn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
    for leaf, (_, _, to_hf) in layout.items():
        if leaf.startswith("layers/"):
            for i in range(CFG.num_layers):
                hf = np.asarray(to_hf(np.asarray(params["layers"][leaf[7:]][i])), np.float32)
                if leaf == "layers/wq":
                    hf = _llama_cpp_permute(hf, CFG.num_heads)
                elif leaf == "layers/wk":
                    hf = _llama_cpp_permute(hf, CFG.num_kv_heads)
                w.add_tensor(f"blk.{i}.{names[leaf[7:]]}.weight", np.ascontiguousarray(hf))
        else:
            w.add_tensor(f"{names[leaf]}.weight", np.ascontiguousarray(to_hf(np.asarray(params[leaf]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return params


def test_a_llama_cpp_layout_comes_back_as_the_original_weights(tmp_path, monkeypatch):
    import transformers

    params = _write(tmp_path / "m.gguf")
    # the tokenizer is transformers' GGUF conversion, which needs vocabulary fields this file lacks
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: type("Tok", (), {"save_pretrained": lambda self, d: None})())
    import_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "hf"))
    cfg = models.load_config(tmp_path / "hf")
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.tie_word_embeddings) == (4, 2, False)
    got = models.load_hf_params(tmp_path / "hf", cfg)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_unsupported_architecture_is_refused_by_field(tmp_path):
    _write(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(ConfigError, match="m.gguf: GGUF metadata field 'general.architecture': 'mamba'"):
        import_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "hf"))
