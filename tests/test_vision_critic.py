"""The frontend's vision-language critic (`sweet_jax.ranking.vision_critic`): its chat layout, its image pairs from
collected rollouts (the official |delta| >= 0.1 pairs), its reward against a NumPy mean of the score head's values
on a tiny random Qwen2-VL, and its ranking job, which renders every distinct candidate page once, ever (across
states and across a resumed run), scoring a page that fails to render as the official no-answer image."""

import json
import os
import threading

import numpy as np
import pytest

from sweet_jax.colbench import synthetic_frontend as sf
from sweet_jax.colbench.render import solid_png
from sweet_jax.colbench.render_cache import RenderCache, page_hash
from sweet_jax.data.trajectories import read_trajectories
from sweet_jax.ranking import vision_critic as vc


class FlatRenderer:
    """Draws a page as a flat image of its background colour; "FAIL" pages do not render. Counts every render."""

    log: list = []
    lock = threading.Lock()

    def render(self, html, out_path):
        with FlatRenderer.lock:
            FlatRenderer.log.append(html)
        if "FAIL" in html:
            return None
        colour = next((rgb for name, rgb in sf.BACKGROUNDS.items() if f"bg-{name}-100" in html), (255, 255, 255))
        with open(out_path, "wb") as fh:
            fh.write(solid_png(112, 84, colour))
        return out_path

    def close(self):
        pass


def _trajectories(tmp_path, rewards):
    """Rollouts of one task in the block layout, their final pages rendered into the collection's images folder."""
    images = tmp_path / "data" / "train.jsonl.images"
    cache = RenderCache(str(images), renderer_factory=FlatRenderer)
    task = sf.make_design_task(__import__("random").Random(0), "t0")
    cache.screenshot(task["ground_truth"])
    lines = []
    for k, r in enumerate(rewards):
        page = sf.page_html(sf.Design("Books", sorted(sf.BACKGROUNDS)[k % 4], "red", "end"))
        history = [{"role": "user", "content": task["problem_description"]},
                   {"role": "assistant", "content": "q", "input": "<prompt>", "output": "q"},
                   {"role": "user", "content": sf.NO_PAGE_REPLY},
                   {"role": "assistant", "content": " " + page, "input": "<prompt2>", "output": "OUTPUT: " + page}]
        lines.append({"task": task, "dialogue_history": history, "answer": cache.screenshot(page), "reward": r})
    path = tmp_path / "data" / "train.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path), task, str(images)


def test_critic_messages_layout():
    history = [{"role": "user", "content": "make a page"}, {"role": "assistant", "content": "q"}]
    with_target = vc.critic_messages("t.png", history, "p.png", "reply")
    assert with_target == [{"role": "user", "content": [
        {"type": "text", "text": vc.TARGET_CAPTION}, {"type": "image_url", "image_url": {"url": "t.png"}},
        {"type": "text", "text": vc.DIALOGUE_CAPTION + "user:make a page\n\n\n\nassistant:q"},
        {"type": "text", "text": vc.PAGE_CAPTION}, {"type": "image_url", "image_url": {"url": "p.png"}}]},
        {"role": "assistant", "content": "reply"}]
    without = vc.critic_messages(None, history, "p.png", "reply")
    assert without[0]["content"] == with_target[0]["content"][2:] and without[1] == with_target[1]


def test_image_pairs_follow_the_official_pair_rule(tmp_path):
    path, task, images = _trajectories(tmp_path, [0.9, 0.85, 0.4, 0.8])
    trajs = list(read_trajectories(path, streaming=False))
    records = vc.image_pair_records(trajs, images, str(tmp_path / "data"))
    # |delta| >= 0.1: (0,2) (1,2) (2,3); (0,1) 0.05 and (0,3) 0.1 - float: 0.9 - 0.8 = 0.0999... < 0.1, left out
    assert len(records) == 3
    chosen_pages = [r["chosen"]["messages"][0]["content"][4]["image_url"]["url"] for r in records]
    rejected_pages = [r["rejected"]["messages"][0]["content"][4]["image_url"]["url"] for r in records]
    pages = [os.path.relpath(t.answer, tmp_path / "data") for t in trajs]
    assert chosen_pages == [pages[0], pages[1], pages[3]] and rejected_pages == [pages[2]] * 3
    target = records[0]["chosen"]["messages"][0]["content"][1]["image_url"]["url"]
    assert target == os.path.join("train.jsonl.images", page_hash(task["ground_truth"]) + ".png")
    assert records[0]["chosen"]["messages"][1]["content"] == trajs[0].last_turn["output"]
    no_target = vc.image_pair_records(trajs, images, str(tmp_path / "data"), with_target=False)
    assert [r["chosen"]["messages"][0]["content"] for r in no_target] == [
        r["chosen"]["messages"][0]["content"][2:] for r in records]


@pytest.fixture(scope="module")
def vision_head(tmp_path_factory):
    """A random-init tiny Qwen2-VL with a score head, the vision ChatML tokenizer beside it."""
    from sweet_jax.models.random_weights import RandomInitSettings, write_random_init

    out = str(tmp_path_factory.mktemp("vlm") / "hf")
    write_random_init(RandomInitSettings(output=out, preset="qwen2-vl-tiny", std=0.1, seed=3,
                                         overrides='{"score_head": true}'))
    return out


@pytest.mark.slow
def test_the_judges_reward_is_the_mean_of_the_score_heads_values(tmp_path, vision_head):
    """Candidates of different lengths and images scored in one padded batch equal, each, the NumPy mean of the
    per-token values of its own unpadded chat."""
    import jax.numpy as jnp

    from sweet_jax import models
    from sweet_jax.training.image_pairs import chat_example, image_arrays
    from sweet_jax.training.batch_scores import batch_images, model_positions

    cache = RenderCache(str(tmp_path / "renders"), renderer_factory=FlatRenderer)
    judge = vc.VisionJudge(vision_head, cache)
    target = sf.page_html(sf.Design("Books", "gray", "red", "end"))
    history = [{"role": "user", "content": "Build a page."}]
    replies = ["A question with no page?", "OUTPUT: " + sf.page_html(sf.Design("Books", "blue", "red", "end")),
               "I WANT TO ANSWER: " + target, "OUTPUT: <html>FAIL</html>"]
    scores = judge(target, history, replies, where="test")
    pages = judge.pages(history, replies)
    assert pages[0] == pages[3] == cache.no_answer  # no page before, and a page that fails: the no-answer image
    loaded = models.load_model(vision_head, "float32")
    for reply, page, score in zip(replies, pages, scores):
        ex = chat_example(vc.critic_messages(cache.screenshot(target), history, page, reply), "test", "c", "/",
                          judge.builder, judge.cfg, judge.images)
        tokens, seg = ex.tokens[None], np.ones((1, len(ex.tokens)), np.int32)
        batch = {"tokens": tokens, "segment_ids": seg, **image_arrays([ex], tokens, seg, judge.cfg)}
        values = np.asarray(models.token_values(loaded.params, loaded.cfg, jnp.asarray(tokens), model_positions(
            {k: jnp.asarray(v) for k, v in batch.items()}), jnp.asarray(seg), images=batch_images(
            {k: jnp.asarray(v) for k, v in batch.items()})))
        assert score == pytest.approx(float(np.mean(values[0])), abs=1e-5)
    assert len(set(np.round(scores, 6))) == 4  # the images and texts make a difference


def test_rank_vision_renders_every_page_once_and_resumes(tmp_path, vision_head):
    from sweet_jax.files.jsonl import write_jsonl

    pages = [sf.page_html(sf.Design("Books", b, "red", "end")) for b in sf.BACKGROUNDS]
    target = sf.page_html(sf.Design("Books", "gray", "pink", "start"))
    states = []
    for i in range(3):  # candidates repeat within and across states
        cands = ["OUTPUT: " + pages[(i + k) % 4] for k in range(6)] + ["a question", "OUTPUT: <html>FAIL</html>"]
        states.append({"input": "<prompt>", "ground_truth": target, "messages": [
            {"role": "user", "content": "Build a page."}, {"role": "assistant", "content": "x"}],
            "additional_outputs": cands, "additional_reference_logprobs": [0.0] * 8,
            "additional_reference_logprobs_sum": [0.0] * 8})
    sampled = str(tmp_path / "sampled.jsonl")
    write_jsonl(sampled, states)
    out = str(tmp_path / "ranked.jsonl")
    FlatRenderer.log = []
    settings = vc.RankVisionSettings(critic=vision_head, input=sampled, output=out)
    vc.rank_vision(settings, renderer_factory=FlatRenderer)
    ranked = [json.loads(x) for x in open(out)]
    assert [len(r["judge_result"]) for r in ranked] == [8, 8, 8]
    assert sorted(FlatRenderer.log) == sorted({*pages, target, "<html>FAIL</html>"})  # each distinct page once
    os.remove(out)
    vc.rank_vision(settings, renderer_factory=FlatRenderer)  # a rerun renders nothing
    assert len(FlatRenderer.log) == 6
    assert [json.loads(x)["judge_result"] for x in open(out)] == [r["judge_result"] for r in ranked]


@pytest.mark.slow
def test_frontend_best_of_n_picks_the_judges_best_scores_its_pages_and_resumes_after_a_kill(tmp_path, vision_head,
                                                                                          monkeypatch):
    """`best_of_n evaluate --task_type frontend`: a tiny random policy on design tasks whose second candidate at every
    state is replaced by a page of the design domain (a random policy writes none), the describer served as the
    simulated human, a text critic and the vision critic (with and without the target) as judges.
    - Every turn of a judge's episode takes the highest-scored of its state's first N candidates (random: the first),
      and every state keeps each judge's scores.
    - Every episode's reward is its own final page's similarity to its own task's target page.
    - After a kill (the cache holding the first half of its records and a torn line), the same command samples only
      the states it had not kept and writes the same table and episodes."""
    import dataclasses
    import hashlib
    import random
    import socket

    import jax

    from sweet_jax.chat import load_tokenizer
    from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir

    from sweet_jax import models
    from sweet_jax.colbench.similarity import Similarity
    from sweet_jax.inference import scheduler
    from sweet_jax.inference.backends import BackendSettings, ManagedServer, server_command
    from system import renderer_missing

    from sweet_jax.files.jsonl import write_jsonl
    from sweet_jax.ranking import selection

    if renderer_missing():
        pytest.skip(renderer_missing())
    cfg = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                                    num_kv_heads=2)
    models.save_hf_params(models.init_params(cfg, jax.random.key(0), std=0.1), cfg, tmp_path / "policy")
    rng = random.Random(0)
    tasks = [sf.make_design_task(rng, f"t{i}") for i in range(2)]
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = server_command(BackendSettings(backend="describer"), "design-describer", port, __import__("sys").executable)
    server = ManagedServer(cmd, port, str(tmp_path / "describer.log"), start_timeout_s=60, what="describer").start()
    out = tmp_path / "bon.json"
    sampled = []  # the prompts each run samples candidates for
    generate, tok = scheduler.generate, load_tokenizer(bundled_llama3_tokenizer_dir())

    def page_of(prompt: list[int]) -> str:  # a design drawn from the state: the same in a resumed run
        return sf.page_html(sf.random_design(random.Random(hashlib.sha256(str(prompt).encode()).hexdigest()),
                                             tasks[0]["ground_truth"].split("<h1>")[1].split("</h1>")[0]))

    def scripted_generate(params, cfg, prompts, *args, **kw):
        sampled.extend(prompts)
        results = generate(params, cfg, prompts, *args, **kw)
        return [[samples[0], dataclasses.replace(samples[1], tokens=tok.encode(page_of(p), add_special_tokens=False))]
                for p, samples in zip(prompts, results)]

    monkeypatch.setattr(scheduler, "generate", scripted_generate)
    try:
        judge = selection.judge_spec
        settings = selection.SelectionSettings(
            policy=str(tmp_path / "policy"), simulator="design-describer", tasks=str(tmp_path / "tasks.jsonl"),
            task_type="frontend", simulator_url=server.url + "/v1", output=str(out), ns="1,2",
            max_steps=2, max_tokens=6, simulator_max_tokens=32, judge=[
                judge("text critic", str(tmp_path / "policy"), "critic"),
                judge("vision critic", vision_head, "vision"),
                judge("vision w/o target", vision_head, "vision", "no-target")])
        result = selection.evaluate(settings)
        table = json.loads(out.read_text())
        episodes = [json.loads(x) for x in open(f"{out}.trajectories.jsonl")]
        lines = open(f"{out}.states.jsonl").read().splitlines(keepends=True)
        first_run = len(sampled)

        # the kill: the cache as a killed run leaves it, the outputs not yet written
        kept = lines[:len(lines) // 2]
        open(f"{out}.cache.partial", "w").write("".join(kept) + lines[len(kept)][:25])
        for f in (out, f"{out}.trajectories.jsonl", f"{out}.states.jsonl"):
            os.remove(f)
        sampled.clear()
        again = selection.evaluate(settings)
    finally:
        server.stop()
    assert result["similarity"] == table["similarity"]
    assert set(table["similarity"]) == {"random", "text critic", "vision critic", "vision w/o target"}
    assert all(table["episodes"][sel] == {"1": 2, "2": 2} for sel in table["episodes"])
    assert len(episodes) == 16
    states = {(r["repeat"], r["task"], r["prompt"]): r for r in map(json.loads, lines) if r["kind"] == "state"}
    assert first_run == len(states) and all(len(s["judge"][j]) == 2 for s in states.values() for j in
                                            ("text critic", "vision critic", "vision w/o target"))
    turns = 0
    for e in episodes:
        for m in e["dialogue_history"]:
            if m["role"] != "assistant":
                continue
            st = states[(e["repeat"], e["task_index"], m["input"])]
            scores = st["judge"][e["selector"]][:e["n"]] if e["selector"] != "random" else [0.0]
            assert m["output"] == st["candidates"][scores.index(max(scores))], (e["selector"], e["n"], scores)
            turns += 1
        replies = [m["content"] for m in e["dialogue_history"][2::2]]
        assert all(r in (sf.NO_PAGE_REPLY, sf.SAME_REPLY) or r.startswith("Mine is different.") for r in replies)
    assert turns > len(episodes)  # some episodes went on past their first turn
    # some judge picks a candidate other than the first: the selection is exercised
    assert any(st["judge"][j][1] > st["judge"][j][0] for st in states.values() for j in st["judge"])
    renders = RenderCache(str(tmp_path / "bon.json.images"))  # the episodes' pages, rendered once already
    for e in episodes:
        target = renders.lookup(tasks[e["task_index"]]["ground_truth"])
        answer = None if e["answer"] == "No answer" else e["answer"]
        assert target and e["reward"] == pytest.approx(Similarity("pixel")(answer, target), abs=1e-9)
    rewards = {round(e["reward"], 9) for e in episodes}
    assert len(rewards) > 2 and max(rewards) > 0  # pages far from and close to their targets
    # the resumed run: the kept states were not sampled again, and the results are the same
    kept_states = sum(json.loads(x)["kind"] == "state" for x in kept)
    assert 0 < kept_states < len(states) and len(sampled) == len(states) - kept_states
    assert again == result and json.loads(out.read_text()) == table
    assert [json.loads(x) for x in open(f"{out}.trajectories.jsonl")] == episodes
