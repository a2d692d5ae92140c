"""The frontend's vision-language critic: what it sees, its training pairs, and its ranking of HTML candidates.

The paper's frontend critic is Qwen2-VL-7B-Instruct with a regression head (reward = the mean of its per-token
values), but which images it sees and how its pairs are built are not released. This project's choice, one layout
for training and ranking (`critic_messages`):

    user:      "The page the human wants:" <the target page's screenshot>      (the training-time information)
               "The conversation so far:" <the dialogue before the turn, as role:content blocks>
               "The page after this reply:" <the screenshot of the page the reply leaves>
    assistant: <the reply>

- The target screenshot is the frontend's reference solution in the form the simulated human holds it: the human
  sees only images, so an image is the information a critic can compare with the agent's page as the human will. The
  "without the target" ablation (`with_target=False`) drops it and its caption.
- The page after the reply is the reply's own HTML rendered, else the last page the agent gave before it (what the
  human's screenshot still shows), else the official no-answer image (black, 224 x 224). So a draft is judged by how
  it looks, and a question by the page that stands.
- The dialogue and the reply stay as text: they say what the turn does (a draft, a question, an answer).

Training pairs (`image_pair_records`) are the official frontend pairs (every two rollouts of a task whose
similarities differ by at least 0.1), each side its trajectory's last turn with the trajectory's final page.
Ranking (`rank_vision`, `python -m sweet_jax.best_of_n rank_vision`) renders every candidate of every sampled state
through the render cache (each distinct page once, in parallel, by content hash; a page that fails to render is the
no-answer image), scores each with the critic, and writes the ranked layout (`judge_result`) that the pairs and the
actor read, resuming from OUT.partial after a kill.
"""

from __future__ import annotations

import dataclasses
import os

from sweet_jax.cli.app import flag
from sweet_jax.colbench.env import split_output
from sweet_jax.colbench.html import extract_html
from sweet_jax.colbench.prompts import render_dialogue
from sweet_jax.ranking.candidates import DTYPES

TARGET_CAPTION = "The page the human wants:"
DIALOGUE_CAPTION = "The conversation so far:\n"
PAGE_CAPTION = "The page after this reply:"


def reply_page(reply: str) -> str | None:
    """The HTML a reply gives, as the frontend episode finds it (after OUTPUT:), or None."""
    return extract_html(split_output(reply)[0])


def critic_messages(target: str | None, history: list[dict], page: str, reply: str) -> list[dict]:
    """The critic's chat for one reply: `target` and `page` are image references (paths or data URLs; `target`
    None leaves the target out), `history` the dialogue before the reply."""
    parts = []
    if target is not None:
        parts += [{"type": "text", "text": TARGET_CAPTION}, {"type": "image_url", "image_url": {"url": target}}]
    parts += [{"type": "text", "text": DIALOGUE_CAPTION + render_dialogue(history)},
              {"type": "text", "text": PAGE_CAPTION}, {"type": "image_url", "image_url": {"url": page}}]
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": reply}]


def image_pair_records(trajectories, images_dir: str, relative_to: str, min_gap: float = 0.1,
                       with_target: bool = True) -> list[dict]:
    """The image-pairs records (`training.image_pairs`) of the official frontend pairs of collected trajectories.
    `images_dir`: the collection's screenshots (targets by content hash, and the no-answer image); image paths are
    written relative to `relative_to` (the pairs file's folder)."""
    from sweet_jax.colbench.render_cache import NO_ANSWER_PNG, page_hash
    from sweet_jax.data.pairs import gap_pairs

    def rel(path: str) -> str:
        return os.path.relpath(path, relative_to)

    def side(t) -> dict:
        last = t.last_turn
        history = t.dialogue[:-1]
        page = t.answer if t.answer and os.path.exists(t.answer) else os.path.join(images_dir, NO_ANSWER_PNG)
        target = os.path.join(images_dir, page_hash(t.task["ground_truth"]) + ".png") if with_target else None
        return {"messages": critic_messages(rel(target) if target else None, history, rel(page), last["output"])}

    return [{"task": p.chosen.task_key, "chosen": side(p.chosen), "rejected": side(p.rejected)}
            for p in gap_pairs(trajectories, min_gap)]


PAPER_MIN_PIXELS, PAPER_MAX_PIXELS = 16 * 28 * 28, 64 * 28 * 28  # the official critic's image sizes


@dataclasses.dataclass(frozen=True)
class RankVisionSettings:
    critic: str = flag(help="the vision-language critic: an HF directory or a training run (score head)",
                       required=True)
    input: str = flag(help="sampled states (the output of `sample`)", required=True)
    output: str = flag(help="the ranked states, JSONL", required=True)
    renders: str | None = flag(None, help="the render cache's folder (default: OUT.images)")
    no_target: bool = flag(False, help="leave the target screenshot out (the critic trained without it)")
    render_workers: int = flag(2, help="Chromium renderers working side by side")
    min_pixels: int = flag(PAPER_MIN_PIXELS, help="images are resized to at least this many pixels")
    max_pixels: int = flag(PAPER_MAX_PIXELS, help="... and at most this many")
    max_len: int = flag(4096, help="tokens of one scored chat, images included, at most")
    dtype: str = flag("float32", help="compute dtype", choices=DTYPES)


class VisionJudge:
    """Scores replies with a vision-language regression-head critic: `judge(target_html, history, replies)` ->
    one reward per reply (the mean of the per-token values over the chat, as the critic was trained), each reply's
    page taken from the render cache `cache` (`colbench.render_cache.RenderCache`)."""

    def __init__(self, critic: str, cache, *, with_target: bool = True, min_pixels: int = PAPER_MIN_PIXELS,
                 max_pixels: int = PAPER_MAX_PIXELS, max_len: int = 4096, dtype: str = "float32"):
        import jax

        from sweet_jax import models
        from sweet_jax.data.examples import ExampleBuilder
        from sweet_jax.files.errors import DataError
        from sweet_jax.models.qwen2_vl_images import ImageSettings

        loaded = models.load_model(critic, dtype)
        if not loaded.cfg.score_head or getattr(loaded.cfg, "vision", None) is None:
            raise DataError(f"{critic}: the vision critic must be a vision-language model with a score head (a "
                            f"critic trained with objective 'reward' on image pairs)")
        self.params, self.cfg, self.cache, self.with_target = loaded.params, loaded.cfg, cache, with_target
        tok = loaded.tokenizer(None)
        self.builder = ExampleBuilder(tok, max_len, chat_format=loaded.chat_format_for(tok))
        self.images = ImageSettings.of_model(critic, min_pixels=min_pixels, max_pixels=max_pixels)
        self._rewards = jax.jit(self._batch_rewards)

    def _batch_rewards(self, params, batch):
        from sweet_jax import models, objectives
        from sweet_jax.training.batch_scores import batch_images, model_positions

        values = models.token_values(params, self.cfg, batch["tokens"], model_positions(batch), batch["segment_ids"],
                                     images=batch_images(batch))
        return objectives.masked_mean(values, batch["segment_ids"] > 0)

    def pages(self, history: list[dict], replies: list[str]) -> list[str]:
        """The screenshot each reply leaves (see the module docstring), rendering what is new."""
        earlier = [p for p in (extract_html(m["content"]) for m in history if m.get("role") == "assistant") if p]
        own = [reply_page(r) for r in replies]
        shots = self.cache.screenshots(earlier + own)
        rendered = [shot for shot, p in zip(shots, earlier) if not self.cache.failed(p)]
        standing = rendered[-1] if rendered else self.cache.no_answer
        return [standing if html is None else shot for html, shot in zip(own, shots[len(earlier):])]

    def __call__(self, target_html: str, history: list[dict], replies: list[str], where: str = "") -> list[float]:
        import numpy as np

        from sweet_jax.data.buckets import round_up
        from sweet_jax.training.image_pairs import chat_example, image_arrays

        target = self.cache.screenshot(target_html) if self.with_target else None
        # the screenshots are absolute paths, so any base folder resolves them
        rows = [chat_example(critic_messages(target, history, page, reply), where, f"candidate {k}", "/",
                             self.builder, self.cfg, self.images)
                for k, (page, reply) in enumerate(zip(self.pages(history, replies), replies))]
        length = round_up(max(len(e.tokens) for e in rows), 128)
        tokens = np.zeros((len(rows), length), np.int32)
        segments = np.zeros((len(rows), length), np.int32)
        for i, e in enumerate(rows):
            tokens[i, :len(e.tokens)], segments[i, :len(e.tokens)] = e.tokens, 1
        batch = {"tokens": tokens, "segment_ids": segments, **image_arrays(rows, tokens, segments, self.cfg)}
        return [float(r) for r in np.asarray(self._rewards(self.params, batch))]


def rank_vision(s: RankVisionSettings, renderer_factory=None) -> dict:
    """SWEET-RL step 4 with the vision critic: `judge_result` for every candidate of every sampled state.
    `renderer_factory`: the render cache's (default the offline Chromium renderer)."""
    from tqdm.auto import tqdm

    from sweet_jax.colbench.render_cache import RenderCache
    from sweet_jax.files.jsonl import read_jsonl
    from sweet_jax.ranking.candidates import Share

    records = read_jsonl(s.input, ("ground_truth", "messages", "additional_outputs"))
    share = Share(s.output, len(records))
    with RenderCache(s.renders or s.output + ".images", workers=s.render_workers,
                     renderer_factory=renderer_factory) as cache:
        todo = share.todo()
        pages = [p for i in todo for p in [records[i]["ground_truth"], *map(reply_page,
                                                                              records[i]["additional_outputs"])] if p]
        cache.screenshots(pages)  # every page at once, on all the renderers
        judge = VisionJudge(s.critic, cache, with_target=not s.no_target, min_pixels=s.min_pixels,
                            max_pixels=s.max_pixels, max_len=s.max_len, dtype=s.dtype)
        with share.part as part:
            for i in tqdm(todo, desc="rank with the vision critic", disable=None):
                rec = records[i]
                scores = judge(rec["ground_truth"], rec["messages"][:-1], rec["additional_outputs"],
                               where=f"{s.input}:{i + 1}")
                part.append({"line": i, "record": {**rec, "judge_result": scores}})
        share.finish()
    return {"states": len(records), "renders": cache.renders}
