"""`python -m sweet_jax.serve` through the `openai` client: a tiny random model with the real Llama-3 tokenizer."""

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import budget
import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
from system import needs_bwrap, start_server

from sweet_jax.colbench import synthetic
from sweet_jax.files.jsonl import write_jsonl

from sweet_jax import models
from sweet_jax.chat import load_tokenizer
from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                num_kv_heads=2)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("served")
    params = models.init_params(CFG, jax.random.key(0), std=0.1)
    models.save_hf_params(params, CFG, d / "model")
    proc, url = start_server(d / "model", d, "--max-model-len", "2048")
    yield {"url": url, "params": params, "proc": proc, "log": d / "server.log"}
    proc.terminate()
    proc.wait(timeout=30)


def _client(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="none", timeout=300)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def test_models_and_health(server):
    models_ = _client(server).models.list()
    assert [m.id for m in models_.data] == ["model"]


def test_chat_with_n_16_and_logprobs(server):
    r = _client(server).chat.completions.create(model="model", messages=MESSAGES, n=16, max_tokens=8,
                                                temperature=1.0, logprobs=True, seed=3)
    assert len(r.choices) == 16
    texts = {c.message.content for c in r.choices}
    assert len(texts) > 1  # different samples
    for c in r.choices:
        assert c.finish_reason in ("stop", "length") and c.logprobs.content
        assert all(t.logprob <= 0 for t in c.logprobs.content)
    assert r.usage.completion_tokens >= 16


def test_seeded_greedy_chat_is_deterministic_and_matches_the_model(server):
    from sweet_jax.chat.llama3 import render_text

    c = _client(server)
    a = c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=6, temperature=0.0, logprobs=True)
    b = c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=6, temperature=0.0)
    assert a.choices[0].message.content == b.choices[0].message.content
    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    ids = tok.encode(render_text(MESSAGES, add_generation_prompt=True), add_special_tokens=False)
    forward, seq = jax.jit(lambda p, t: models.forward(p, CFG, t)), list(ids)
    for _ in range(6):  # right-padded to one length, one compiled program (causal: padding changes no earlier logit)
        logits = forward(server["params"], jnp.asarray([seq + [0] * (len(ids) + 6 - len(seq))], jnp.int32))
        seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    expected = seq[len(ids):]
    assert a.choices[0].message.content == tok.decode([t for t in expected if t not in (128001, 128008, 128009)])


def test_stop_strings_cut_the_text(server):
    c = _client(server)
    full = c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=12, temperature=0.0)
    text = full.choices[0].message.content
    assert len(text) > 4
    stop = text[3:5]
    cut = c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=12, temperature=0.0, stop=[stop])
    assert cut.choices[0].message.content == text[:text.find(stop)] and cut.choices[0].finish_reason == "stop"


def test_streaming_gives_the_same_text_chunk_by_chunk(server):
    c = _client(server)
    full = c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=10, temperature=0.0)
    chunks = list(c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=10, temperature=0.0,
                                            stream=True))
    assert len(chunks) >= 3
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_completions_echo_logprobs_score_the_prompt(server):
    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    prompt = "The quick brown fox jumps over the lazy dog"
    r = _client(server).completions.create(model="model", prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    lp = r.choices[0].logprobs
    ids = tok.encode(prompt, add_special_tokens=False)
    assert r.choices[0].text == prompt and lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
    ref = jax.nn.log_softmax(models.forward(server["params"], CFG, jnp.asarray([ids]))[0], axis=-1)
    expected = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
    np.testing.assert_allclose(lp.token_logprobs[1:], expected, atol=1e-4)
    gen = _client(server).completions.create(model="model", prompt=ids, max_tokens=5, temperature=0.0, logprobs=0)
    assert len(gen.choices[0].logprobs.token_logprobs) <= 5


def test_64_concurrent_requests_complete(server):
    async def go():
        client = openai.AsyncOpenAI(base_url=server["url"] + "/v1", api_key="none", timeout=600)
        rs = await asyncio.gather(*(client.chat.completions.create(
            model="model", messages=[{"role": "user", "content": f"Request {i}"}], max_tokens=4 + i % 5,
            temperature=1.0, seed=i) for i in range(64)))
        await client.close()
        return rs

    rs = asyncio.run(go())
    assert len(rs) == 64 and all(r.choices[0].finish_reason in ("stop", "length") for r in rs)


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    (json.dumps({"model": "model"}).encode(), 400),  # no messages
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}).encode(), 400),
    (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}).encode(), 400),
])
def test_malformed_requests_get_4xx_and_the_server_stays_up(server, body, status):
    req = urllib.request.Request(server["url"] + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == status
    assert "message" in json.loads(e.value.read())["error"]
    assert urllib.request.urlopen(server["url"] + "/health", timeout=10).status == 200
    assert server["proc"].poll() is None


def _synthetic_tasks(tmp_path, n: int) -> str:
    """n synthetic ColBench backend tasks (`colbench.synthetic`) in a JSONL file."""
    import random

    path = tmp_path / "tasks.jsonl"
    write_jsonl(path, [synthetic.make_ask_task(random.Random(i), task_id=f"ask-{i}") for i in range(n)])
    return str(path)


@needs_bwrap
def test_collection_runs_against_the_server_as_agent_and_simulator(server, tmp_path):
    """The embedded default: sweet_jax.serve is both endpoints of a ColBench collection (completions for the agent,
    chat for the simulator), on synthetic backend tasks."""
    proc = subprocess.run(
        [sys.executable, "-m", "sweet_jax.collect", "--config", os.path.join(ROOT, "configs", "collect_backend.py"),
         f"--config.tasks={_synthetic_tasks(tmp_path, 3)}",
         f"--config.output={tmp_path / 'out.jsonl'}", "--config.limit=3", "--config.rollouts=1",
         "--config.max_steps=2", f"--config.agent.base_url={server['url']}/v1", "--config.agent.model=model",
         "--config.agent.max_tokens=12", f"--config.simulator.base_url={server['url']}/v1",
         "--config.simulator.model=model", "--config.simulator.max_tokens=12"],
        cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert len(records) == 3
    for rec in records:
        roles = [m["role"] for m in rec["dialogue_history"]]
        assert roles[0] == "user" and roles[-1] == "assistant" and len(roles) in (2, 4)
        assert rec["reward"] is not None


@pytest.mark.slow
def test_a_seeded_collection_replays_the_same_conversations_at_any_concurrency(server, tmp_path):
    """Continuous batching makes collection reproducible: the same seed, with 8 conversations in flight or one at a
    time, gives the same sampled conversations (agent at temperature 1)."""
    tasks = _synthetic_tasks(tmp_path, 4)
    outs = []
    for i, concurrency in enumerate((8, 1)):
        out = tmp_path / f"out{i}.jsonl"
        proc = subprocess.run(
            [sys.executable, "-m", "sweet_jax.collect", "--config", os.path.join(ROOT, "configs", "collect_backend.py"),
             f"--config.tasks={tasks}", f"--config.output={out}", "--config.limit=4", "--config.rollouts=2",
             "--config.max_steps=2", f"--config.concurrency={concurrency}", "--config.evaluate=False",
             f"--config.agent.base_url={server['url']}/v1", "--config.agent.model=model",
             "--config.agent.max_tokens=12", "--config.agent.temperature=1.0",
             f"--config.simulator.base_url={server['url']}/v1", "--config.simulator.model=model",
             "--config.simulator.max_tokens=12"], cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
        assert proc.returncode == 0, proc.stderr[-3000:]
        recs = [json.loads(line) for line in open(out)]
        outs.append({(r["task_id"], r["rollout"]): r["dialogue_history"] for r in recs})
    assert len(outs[0]) == 8 and outs[0] == outs[1]
    first = [h for (t, k), h in outs[0].items() if t == 0]
    assert first[0] != first[1]  # the two rollouts of a task differ: they were sampled, with different seeds


def test_streamed_chat_with_a_stop_string_matches_the_whole_response(server):
    c = _client(server)
    full = c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=24, temperature=0.0)
    text = full.choices[0].message.content
    stop = text[9:11]
    whole = c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=24, temperature=0.0, stop=[stop],
                                      logprobs=True)
    chunks = list(c.chat.completions.create(model="model", messages=MESSAGES, max_tokens=24, temperature=0.0,
                                            stop=[stop], logprobs=True, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.choices[0].message.content
    streamed_lps = [t.logprob for ch in chunks if ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert streamed_lps == [t.logprob for t in whole.choices[0].logprobs.content]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason] == ["stop"]


# ---------------------------------------------------------------------------------------------- detokenizer


def _detok(stops, tok=None):
    from sweet_jax.inference.api import _Detokenizer

    return _Detokenizer(tok or load_tokenizer(bundled_llama3_tokenizer_dir()), (128009,), stops)


@pytest.mark.parametrize("stops", [[], ["漢字"], ["fo"], ["zzz"]])
def test_text_fed_in_any_chunks_equals_the_whole_decoded_text(stops):
    """Fed token by token or in uneven chunks, the pieces join to the one-shot result: the tokenizer's decode of
    all tokens, cut before the first stop string, without the final EOT. Multi-byte characters split across
    tokens never reach the stream half-made; special tokens inside the reply are left out."""
    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    text = "def foo(x):\n    return x  # é ü 漢字 🙂 done"
    ids = tok.encode(text, add_special_tokens=False) + [128009]
    assert any("\ufffd" in tok.decode([t]) for t in ids)  # some characters span tokens
    ids.insert(6, 128006)  # a stray <|start_header_id|> from the model: left out of the text, as vLLM does
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    expected = text[:cut]
    rng = np.random.default_rng(0)
    for chunking in ("one", "tokens", "random"):
        d = _detok(stops, tok)
        sizes = {"one": [len(ids)], "tokens": [1] * len(ids)}.get(chunking) or rng.integers(1, 4, len(ids)).tolist()
        pieces, reasons, pos = [], [], 0
        for size in sizes:
            chunk = ids[pos:pos + size]
            pos += size
            last = pos >= len(ids)
            p = d.feed(chunk, [-0.5] * len(chunk), "stop" if last else None)
            assert "\ufffd" not in p.text
            pieces.append(p)
            reasons += [p.finish_reason] if p.finish_reason else []
            if last:
                break
        assert "".join(p.text for p in pieces) == expected
        assert reasons == ["stop"]
        tokens = [t for p in pieces for t in p.tokens]
        assert "".join(t for t, _, _ in tokens) == expected[:len("".join(t for t, _, _ in tokens))]
        assert all(o == len("".join(t for t, _, _ in tokens[:k])) for k, (_, _, o) in enumerate(tokens))


# ---------------------------------------------------------------------------------------------- engine streaming


def test_engine_streams_while_the_batch_is_still_decoding(monkeypatch):
    """Deltas reach the request while decoding goes on: the scheduler pauses after its first segment until the
    consumer has received that segment's delta (if deltas only arrived after generation, it would wait in vain)."""
    import threading

    from sweet_jax.inference import engine as engine_mod
    from sweet_jax.inference.scheduler import Scheduler

    received = threading.Event()
    paused_in_time = []
    real = Scheduler.step

    def paused(self):
        real(self)
        if not paused_in_time:
            paused_in_time.append(received.wait(timeout=60))

    monkeypatch.setattr(Scheduler, "step", paused)
    params = models.init_params(CFG, jax.random.key(0), std=0.1)
    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    eng = engine_mod.Engine(params, CFG, tok, stream_segment=4)
    sp = engine_mod.SamplingParams(temperature=1.0, max_tokens=20)

    async def go():
        await eng.start()
        got = []
        async for drow in eng.stream(tok.encode("hello", add_special_tokens=False), sp, 2, 7):
            got.append(drow)
            received.set()
        whole = await eng.generate(tok.encode("hello", add_special_tokens=False), sp, 2, 7)
        await eng.stop()
        return got, whole

    got, whole = asyncio.run(go())
    assert paused_in_time[0] is True  # (the whole-result call afterwards passes the same wrapper)
    assert len(got) >= 2 and len(got[0][0].tokens) <= 4
    for j in range(2):
        assert [t for d in got for t in d[j].tokens] == whole[j].tokens
        assert [d[j].finish_reason for d in got if d[j].finish_reason] == [whole[j].finish_reason]
