"""Builds tiny random HF Llama and Qwen2 checkpoints with transformers + torch (test-only; sweet_jax never imports
torch)."""

from __future__ import annotations

import numpy as np
import torch
import transformers


def make_hf_llama(out_dir, *, vocab=257, hidden=64, inter=112, layers=2, heads=4, kv_heads=2, head_dim=None,
                  rope_theta=10000.0, rope_scaling=None, tie=False, max_pos=512, eps=1e-5, init_std=1.5, seed=0,
                  dtype=torch.float32, family="llama"):
    """Save a random `LlamaForCausalLM` (family="qwen2": `Qwen2ForCausalLM`), with weights and biases wider than
    HF's 0.02 default so that mistakes show, and return it."""
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": rope_theta}
    if rope_scaling is not None:
        rope = {"rope_type": "llama3", "rope_theta": rope_theta, **rope_scaling}
    kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
              rms_norm_eps=eps, tie_word_embeddings=tie, rope_parameters=rope)
    if head_dim is not None:
        kw["head_dim"] = head_dim
    config_class, model_class = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                                  "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[family]
    cfg = config_class(**kw)
    cfg._attn_implementation = "eager"
    model = model_class(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))  # non-unit norms so a dropped norm weight shows
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5 * init_std)  # biases as large as a projection's outputs, so a dropped one shows
            else:
                p.normal_(0.0, init_std / np.sqrt(p.shape[-1]))
    model = model.to(dtype)
    model.save_pretrained(out_dir)
    return model


def hf_logits(model, tokens: np.ndarray, attention_mask=None, position_ids=None) -> np.ndarray:
    with torch.no_grad():
        kw = {}
        if attention_mask is not None:
            kw["attention_mask"] = torch.as_tensor(attention_mask)
        if position_ids is not None:
            kw["position_ids"] = torch.as_tensor(position_ids)
        out = model(input_ids=torch.as_tensor(tokens, dtype=torch.long), **kw)
    return out.logits.numpy() if out.logits.dtype == torch.float64 else out.logits.float().numpy()
