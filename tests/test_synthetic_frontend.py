"""The SYNTHETIC design domain of the toy frontend pipeline: every design renders to the look the describer reads
back from its pixels, the describer's replies, its server over the OpenAI vision API (started as the pipeline starts
it), and the scripted pre-training dialogues."""

import json
import random
import socket

import openai
import pytest
from PIL import Image

from system import needs_renderer

from sweet_jax.colbench import prompts
from sweet_jax.colbench import synthetic_frontend as sf
from sweet_jax.colbench.client import png_data_url
from sweet_jax.colbench.describer_server import RequestError, reply_to
from sweet_jax.colbench.env import FrontendEpisode
from sweet_jax.colbench.render import solid_png

ALL = [sf.Design("Pet Clinic", b, c, r) for b in sf.BACKGROUNDS for c in sf.CARD_COLOURS for r in sf.ROWS]


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    from sweet_jax.colbench.render_cache import RenderCache

    with RenderCache(str(tmp_path_factory.mktemp("renders")), workers=2) as cache:
        return dict(zip(ALL, cache.screenshots([sf.page_html(d) for d in ALL])))


@needs_renderer
def test_every_design_is_read_back_from_its_screenshot(screenshots):
    assert len(set(screenshots.values())) == len(ALL) == 48  # 48 distinct pages
    for d, path in screenshots.items():
        assert sf.look_of(Image.open(path)) == d.look, d


@needs_renderer
def test_a_page_without_the_card_or_tailwind(tmp_path):
    from sweet_jax.colbench.render import Renderer

    with Renderer() as r:
        bare = r.render("<html><body><h1>Pet Clinic</h1></body></html>", str(tmp_path / "bare.png"))
        no_css = r.render(sf.page_html(ALL[0]).replace(sf.TAILWIND_URL, "https://example.com/x.css"),
                          str(tmp_path / "nocss.png"))
    assert sf.look_of(Image.open(bare)) == sf.Look("white", None, None)
    assert sf.look_of(Image.open(no_css)).background == "white"  # unstyled: no colours at all


def test_describe_states_the_target_and_what_differs():
    target = sf.Look("gray", "red", "end")
    assert sf.describe(None, target) == sf.NO_PAGE_REPLY
    assert sf.describe(target, target) == sf.SAME_REPLY
    told = 'Mine is different. Use <body class="bg-gray-100">, a card with bg-red-500 and a row with justify-end.'
    assert sf.describe(sf.Look("blue", "red", "start"), target) == told
    assert sf.describe(sf.Look("gray", "pink", "end"), target) == told
    assert sf.describe(sf.Look("white", None, None), target) == told


def _after(ids: list[int], value: list[int], context: int = 3) -> list[tuple[int, ...]]:
    """The `context` tokens before each place `value` stands in `ids`."""
    n = len(value)
    return [tuple(ids[i - context:i]) for i in range(context, len(ids) - n + 1) if ids[i:i + n] == value]


def test_the_details_are_copied_token_for_token():
    """Each hidden detail, and the heading, is the same tokens after the same token(s) in the page as in the request
    (the heading) or the human's reply (the three details): what an induction head copies."""
    from sweet_jax.chat import find_tokenizer

    tok = find_tokenizer()
    rng = random.Random(0)
    for _ in range(20):
        task = sf.make_design_task(rng)
        d = sf.task_design(task)
        page = tok.encode(sf.page_html(d), add_special_tokens=False)
        request = tok.encode(task["problem_description"], add_special_tokens=False)
        reply = tok.encode(sf.describe(sf.Look("white", None, None), d.look), add_special_tokens=False)
        heading = tok.encode(d.heading, add_special_tokens=False)
        assert len(heading) == 1 and set(_after(page, heading)) & set(_after(request, heading)), d.heading
        for cls in (f"-{d.background}", f"-{d.card}", f"-{d.row}"):
            value = tok.encode("x" + cls, add_special_tokens=False)[1:]
            before = _after(reply, value, 1)
            assert set(_after(page, value, 1)) & set(before), cls
            assert reply.count(before[0][0]) == 1, cls  # the token before it points at this detail alone


def _episode_request(tmp_path, agent_page: sf.Design | None, target: sf.Design) -> list[dict]:
    """The simulator messages of a real frontend episode, its pages drawn as flat PNGs of the looks' colours."""
    def draw(d: sf.Design) -> str:
        img = Image.new("RGB", (1366, 768), sf.BACKGROUNDS[d.background])
        x = {"start": 16, "center": 491, "end": 966}[d.row]
        img.paste(Image.new("RGB", (384, 256), sf.CARD_COLOURS[d.card]), (x, 60))
        path = tmp_path / f"{d.background}-{d.card}-{d.row}.png"
        img.save(path)
        return str(path)

    task = {"problem_description": "p", "ground_truth": sf.page_html(target)}
    ep = FrontendEpisode(task, render=lambda html: draw(target if html == task["ground_truth"] else agent_page),
                         image_url=png_data_url, max_steps=3)
    ep.step("A question." if agent_page is None else sf.draft_output(agent_page))
    return ep.simulator_messages()


def test_reply_to_reads_the_episodes_request(tmp_path):
    target = sf.Design("h", "yellow", "indigo", "center")
    draft = sf.Design("h", "yellow", "pink", "start")
    assert reply_to(_episode_request(tmp_path, draft, target)) == sf.describe(draft.look, target.look)
    assert reply_to(_episode_request(tmp_path, None, target)) == sf.NO_PAGE_REPLY
    messages = _episode_request(tmp_path, draft, target)
    messages[0]["content"][1]["image_url"]["url"] = "data:image/png;base64,AAAA"
    with pytest.raises(RequestError, match=r"messages\.0\.content\.1\.image_url: not a decodable image"):
        reply_to(messages)
    fresh = _episode_request(tmp_path, draft, target)
    with pytest.raises(RequestError, match=r"messages\.0\.content: expected 2 image\(s\) .*got 1"):
        reply_to([{"role": "user", "content": fresh[0]["content"][:2]}])


def test_the_describer_is_served_over_the_openai_vision_api(tmp_path):
    """Started as the pipeline starts its simulator role (`backends.server_command`, a `ManagedServer`), and asked
    through the openai client: the describer's reply, and a 400 that names the part for a bad image."""
    from sweet_jax.inference.backends import BackendSettings, ManagedServer, server_command

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = server_command(BackendSettings(backend="describer"), "design-describer", port, "python")
    import sys

    cmd[0] = sys.executable
    server = ManagedServer(cmd, port, str(tmp_path / "describer.log"), start_timeout_s=60, what="describer").start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        target, draft = sf.Design("h", "green", "red", "end"), sf.Design("h", "blue", "red", "end")
        reply = client.chat.completions.create(model="design-describer", temperature=0.0, max_tokens=64,
                                               messages=_episode_request(tmp_path, draft, target))
        assert reply.choices[0].message.content == ('Mine is different. Use <body class="bg-green-100">, a card with '
                                                    'bg-red-500 and a row with justify-end.')
        assert [m.id for m in client.models.list().data] == ["design-describer"]
        bad = _episode_request(tmp_path, draft, target)
        bad[0]["content"][2]["image_url"]["url"] = "http://example.com/x.png"
        with pytest.raises(openai.BadRequestError, match=r"messages\.0\.content\.2\.image_url"):
            client.chat.completions.create(model="design-describer", messages=bad)
    finally:
        server.stop()


def test_design_data(tmp_path):
    files = sf.write_design_data(tmp_path, num_tasks=60, num_test_tasks=10, seed=3)
    train = [json.loads(x) for x in open(files["train_tasks"])]
    test = [json.loads(x) for x in open(files["test_tasks"])]
    assert len(train) == 60 and len(test) == 10
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in test}
    for t in train + test:
        assert t["ground_truth"] == sf.page_html(sf.task_design(t)) and t["synthetic"]
        assert f'<h1>{t["design"]["heading"]}</h1>' in t["problem_description"]
    records = [json.loads(x) for x in open(files["pretrain"])]
    openings = {"draft": 0, "question": 0, "answer": 0}
    for r in records:
        history = r["dialogue_history"]
        assert history[-1]["role"] == "assistant" and history[-1]["input"].endswith(
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert prompts.FRONTEND_AGENT in history[-1]["input"]
        target = sf.task_design(r["task"])
        last = history[-1]["content"]
        if len(history) == 2:
            first = history[1]["content"]
            kind = ("draft" if first.startswith(" <html>") else "question" if first == sf.DRAFT_QUESTION else
                    "answer")
            openings[kind] += 1
        if last.startswith(sf.ANSWER_MARKER) and len(history) == 4 and history[2]["content"] != sf.NO_PAGE_REPLY:
            # after a description: the target page exactly, and the description matches the draft
            assert last == sf.answer_output(target)
            assert history[2]["content"] in {sf.describe(sf.Design(target.heading, b, c, w).look, target.look)
                                             for b in sf.BACKGROUNDS for c in sf.CARD_COLOURS for w in sf.ROWS}
    assert all(count > 5 for count in openings.values()), openings


def test_the_no_answer_image_reads_as_a_black_page():
    import io

    assert sf.look_of(Image.open(io.BytesIO(solid_png(224, 224, (0, 0, 0))))) == sf.Look("black", None, None)
