"""The SYNTHETIC "design" domain: a toy frontend task for the CPU pipeline (configs/sweet_frontend_tiny.py). Not
ColBench. Imports no JAX.

Every target page is a heading and a row holding one card, in Tailwind 2.2.19 (79 tokens of the Llama-3 tokenizer):

    <html><link href="https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css" rel="stylesheet">
    <body class="bg-blue-100"><h1>Fresh Bakery</h1><div class="flex justify-end"><p class="w-96 h-64 m-4
    bg-red-500"></div></body></html>

(on one line). The request names the heading; three details are hidden and seen only in the target's screenshot:
the background colour (4 choices), the card's colour (4) and where the card sits in its row (start, center or
end). The agent
learns them only from the simulated human, and the human only looks at screenshots:

    agent: a draft page                 ->  human: "Mine is different. Use <body class="bg-gray-100">, ..."
                                        ->  agent answers with the details it was told: the target page
    agent: a question, with no page     ->  human: "I cannot see a page yet." -> the agent must guess
    agent answers at once               ->  a guess

So, as in the backend's ask domain, whether an episode succeeds is decided by its first turn. Rewards are the
similarity of the final page's screenshot to the target's (`colbench.similarity`), so a guess earns partial credit.

The simulated human is a deterministic describer of screenshot differences, not a model: `look_of` reads the three
details off a screenshot's pixels (the background at the top-left corner, the first band of wide runs of another
colour as the card: its colour and its horizontal position), and `describe`, when the agent's page differs from the
target, gives the target's details in the page's own classes ("Mine is different. Use <body class="bg-yellow-100">,
a card with bg-red-500 and a row with justify-end."). `python -m sweet_jax.describer` serves it over the OpenAI
vision API (`colbench.describer_server`), so collection runs through the real frontend episode, renderer and client. The
scripted pre-training dialogues take the looks from the designs themselves (no rendering); `look_of` reads the same
looks from every rendered design (tests/test_synthetic_frontend.py).
"""

from __future__ import annotations

import dataclasses
import os
import random

from sweet_jax.colbench.env import ANSWER_MARKER, FrontendEpisode
from sweet_jax.colbench.html import extract_html
from sweet_jax.files.jsonl import write_jsonl

# Tailwind 2.2.19's default palette: the backgrounds are its 100 shades, the cards its 500 shades
BACKGROUNDS = {"gray": (243, 244, 246), "blue": (219, 234, 254), "green": (209, 250, 229), "yellow": (254, 243, 199)}
CARD_COLOURS = {"red": (239, 68, 68), "purple": (139, 92, 246), "pink": (236, 72, 153), "indigo": (99, 102, 241)}
ROWS = ("start", "center", "end")
OTHER_COLOURS = {"white": (255, 255, 255), "black": (0, 0, 0)}  # what a page without the domain's classes shows
# one token each of the Llama-3 tokenizer; the request names the heading as the page writes it (<h1>...</h1>), so a
# tiny model copies it token for token (tests/test_synthetic_frontend.py checks it)
HEADINGS = ("Books", "Music", "Repair", "Studio", "Travel", "Design", "Market", "Health", "Photo", "Games", "Hotel",
            "Food")
TAILWIND_URL = "https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css"  # as ColBench pages load it
NO_PAGE_REPLY = "I cannot see a page yet. Show me a page and I will tell you what to change."
SAME_REPLY = "Your page looks like mine."
DRAFT_QUESTION = "Which colours and layout do you like?"  # the move that shows no page: a question the human can't see
DESIGN_MAX_STEPS = 3


@dataclasses.dataclass(frozen=True)
class Look:
    """What a screenshot shows of a design: colour names and the card's place in its row; None when there is no
    card."""

    background: str
    card: str | None
    row: str | None


@dataclasses.dataclass(frozen=True)
class Design:
    heading: str
    background: str
    card: str
    row: str

    @property
    def look(self) -> Look:
        return Look(self.background, self.card, self.row)


def page_html(d: Design) -> str:
    return (f'<html><link href="{TAILWIND_URL}" rel="stylesheet"><body class="bg-{d.background}-100">'
            f'<h1>{d.heading}</h1><div class="flex justify-{d.row}"><p class="w-96 h-64 m-4 bg-{d.card}-500">'
            f'</div></body></html>')


def random_design(rng: random.Random, heading: str) -> Design:
    return Design(heading, rng.choice(sorted(BACKGROUNDS)), rng.choice(sorted(CARD_COLOURS)), rng.choice(ROWS))


def make_design_task(rng: random.Random, task_id: str = "") -> dict:
    d = random_design(rng, rng.choice(HEADINGS))
    return {
        "problem_description": f"Build a page for my business with the heading <h1>{d.heading}</h1> and one card "
                               f"in a row. I will tell you the colours and the layout once I see your page.",
        "ground_truth": page_html(d),
        "design": dataclasses.asdict(d),
        "synthetic": True,
        "source": "sweet_jax.colbench.synthetic_frontend",
        "task_id": task_id,
    }


def task_design(task: dict) -> Design:
    return Design(**task["design"])


# --------------------------------------------------------------------------------------------- the describer


def _nearest(rgb, palette: dict) -> str:
    return min(palette, key=lambda name: sum((int(a) - b) ** 2 for a, b in zip(rgb, palette[name])))


def look_of(image) -> Look:
    """The look of a screenshot (a PIL image): the background is the colour at the top-left corner; the card row is
    the first band of pixel rows holding a run of at least 100 pixels of another colour. The card's place is where
    the middle of its runs falls: the left, middle or right third of the page."""
    import numpy as np

    arr = np.asarray(image.convert("RGB"), np.int32)
    h, w, _ = arr.shape
    bg_rgb = arr[2, 2]
    background = _nearest(bg_rgb, {**BACKGROUNDS, **OTHER_COLOURS})
    for y in range(0, h, 4):
        line = arr[y]
        other = np.any(np.abs(line - bg_rgb) > 12, axis=-1)
        runs, start = [], None
        for x in range(w + 1):
            on = x < w and other[x]
            if on and start is None:
                start = x
            elif not on and start is not None:
                if x - start >= 100:
                    runs.append((start, x))
                start = None
        if runs:
            middle = (runs[0][0] + runs[-1][1]) / 2
            a, b = runs[0]
            colour = _nearest(np.median(line[a:b], axis=0), {**CARD_COLOURS, **OTHER_COLOURS})
            return Look(background, colour, ROWS[min(2, int(3 * middle / w))])
    return Look(background, None, None)


def describe(agent: Look | None, target: Look) -> str:
    """The human's reply when the agent's page differs from the target: the target's three details, each in the
    page's own classes and after the same tokens as in the page (`class="bg-`, ` bg-`, ` justify-`), so a tiny model
    copies them token for token from the last place they appear (an induction head)."""
    if agent is None:
        return NO_PAGE_REPLY
    if agent == target:
        return SAME_REPLY
    return (f"Mine is different. Use <body class=\"bg-{target.background}-100\">, a card with bg-{target.card}-500 "
            f"and a row with justify-{target.row}.")


# --------------------------------------------------------------------------------------------- scripted data


def _episode(task: dict) -> FrontendEpisode:
    """The real frontend episode, its pages never rendered (the scripted dialogues know their looks)."""
    return FrontendEpisode(task, render=lambda html: "unrendered.png", image_url=str, max_steps=DESIGN_MAX_STEPS)


def draft_output(design: Design) -> str:
    return f"OUTPUT: {page_html(design)}"


def answer_output(design: Design) -> str:
    return f"{ANSWER_MARKER} {page_html(design)}"


def opens_with_draft(record: dict) -> bool:
    """Whether a trajectory record's first agent turn shows a page (the move that gets the details told)."""
    first = next((m for m in record["dialogue_history"] if m["role"] == "assistant"), None)
    return first is not None and extract_html(first["content"]) is not None and ANSWER_MARKER not in first["content"]


def design_rollout(task: dict, rng: random.Random, p_draft: float, p_question: float) -> dict:
    """One scripted collaboration: the agent shows a draft (p_draft), asks a question with no page (p_question) or
    neither, then answers: with the target when it saw the human's description, else with a guess. No reward."""
    target = task_design(task)
    ep = _episode(task)
    u = rng.random()
    told = False
    if u < p_draft:
        draft = random_design(rng, target.heading)
        ep.step(draft_output(draft))
        ep.add_reply(describe(draft.look, target.look))
        told = True
    elif u < p_draft + p_question:
        ep.step(DRAFT_QUESTION)
        ep.add_reply(NO_PAGE_REPLY)
    ep.step(answer_output(target if told else random_design(rng, target.heading)))
    return ep.record()


def told_example(task: dict, rng: random.Random) -> dict:
    """A draft, the human's description of it, and the answer built from that description."""
    target = task_design(task)
    ep = _episode(task)
    draft = random_design(rng, target.heading)
    ep.step(draft_output(draft))
    ep.add_reply(describe(draft.look, target.look))
    ep.step(answer_output(target))
    return ep.record()


def write_design_data(directory: str | os.PathLike, *, num_tasks: int, num_test_tasks: int,
                      p_draft: float = 1 / 3, p_question: float = 1 / 3, seed: int = 0) -> dict[str, str]:
    """The design domain's files (each written atomically), from one seed:
    - pretrain.jsonl: the agent's supervised data, one record per trained turn (for `score_span = "response"`):
      per train task the turns of one scripted dialogue (its opening move a draft, a question or an answer,
      p_draft / p_question / the rest) and one more answer after a description (copying the described details is
      the skill the agent learns last). The human is the describer, so it needs no data;
    - train_tasks.jsonl / test_tasks.jsonl: disjoint task lists."""
    from sweet_jax.colbench.synthetic import turn_records

    rng = random.Random(seed)
    tasks = [make_design_task(rng, f"design-{seed}-{'train' if i < num_tasks else 'test'}-{i}")
             for i in range(num_tasks + num_test_tasks)]
    pretrain = []
    for task in tasks[:num_tasks]:
        pretrain.extend({**r, "reward": 1.0} for r in turn_records(design_rollout(task, rng, p_draft, p_question)))
        pretrain.extend({**r, "reward": 1.0} for r in turn_records(told_example(task, rng))[-1:])
    rng.shuffle(pretrain)
    d = os.fspath(directory)
    return {"pretrain": write_jsonl(os.path.join(d, "pretrain.jsonl"), pretrain),
            "train_tasks": write_jsonl(os.path.join(d, "train_tasks.jsonl"), tasks[:num_tasks]),
            "test_tasks": write_jsonl(os.path.join(d, "test_tasks.jsonl"), tasks[num_tasks:])}
