"""Token examples for training: one templated conversation, its masks, and (for the critic) the information prefix.

The text of an example is what the official pipeline trains on: `[info prefix] + input + output + <end of turn>`,
where `input` is the chat-templated prompt of the final assistant turn (the whole history) and `output` that turn's
raw response. It is tokenised in one call; roles, turns and masks then come from the token ids (the chat format's
`segment`). For a model of another chat format (a ChatML model's own template, say), a prompt written in the
Llama-3.1 format, as the official trajectories are, is first rewritten in the model's format (`chat.convert`).

Masks:
- `score_mask`: the tokens whose log-probs form the sequence score. "assistant" = every assistant turn's content and
  end-of-turn token (mask_style "content") or, as the official code does, also the "\\n\\n" after each header
  (mask_style "official"); "all" = every token after the first (the official policy DPO).
- `response_mask`: the final assistant turn only (the action being judged).
- `turn_ids`: assistant-turn index of each token (-1 elsewhere), for the per-turn reduction.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sweet_jax.chat import ASSISTANT, ROLE_IDS, ChatFormat, get_format
from sweet_jax.chat.convert import in_format
from sweet_jax.data.trajectories import Trajectory
from sweet_jax.files.errors import DataError

INFO_TEMPLATE = "In light that the final answer is: {info}."
MASK_STYLES = ("content", "official")
SCORE_SPANS = ("assistant", "all", "response")


@dataclasses.dataclass(frozen=True)
class Example:
    tokens: np.ndarray  # int32 [T]
    score_mask: np.ndarray  # bool [T]
    response_mask: np.ndarray  # bool [T]
    turn_ids: np.ndarray  # int32 [T]
    truncated: bool
    source: str
    label: float | None = None  # the value-function target (1.0: the trajectory succeeded)
    # a vision-language example's images, (pixels [patches, C * T * P * P], grid_thw [images, 3]), whose feature
    # tokens the `tokens` hold (`training.image_pairs`)
    images: tuple | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class ExampleBuilder:
    """Turns trajectories (or prompt + response strings) into `Example`s for one tokenizer, chat format (a
    `chat.ChatFormat`, or its name; default the default format) and setting."""

    def __init__(self, tokenizer, max_len: int, *, with_info: bool = False, info_key: str = "ground_truth",
                 mask_style: str = "content", score_span: str = "assistant", chat_format: str | None = None):
        if mask_style not in MASK_STYLES:
            raise ValueError(f"mask_style must be one of {MASK_STYLES}, got {mask_style!r}")
        if score_span not in SCORE_SPANS:
            raise ValueError(f"score_span must be one of {SCORE_SPANS}, got {score_span!r}")
        self.tokenizer = tokenizer
        self.chat = chat_format if isinstance(chat_format, ChatFormat) else get_format(chat_format)
        self.fmt = self.chat.tokenized(tokenizer)
        self.max_len = max_len
        self.with_info = with_info
        self.info_key = info_key
        self.mask_style = mask_style
        self.score_span = score_span

    def info_prefix(self, task: dict, source: str) -> str:
        info = task.get(self.info_key)
        if not isinstance(info, str):
            raise DataError(f"{source}: field 'task.{self.info_key}': the critic needs the training-time information "
                            f"as a string, got {type(info).__name__}")
        return INFO_TEMPLATE.format(info=info)

    def from_trajectory(self, traj: Trajectory) -> Example:
        last = traj.last_turn
        info = self.info_prefix(traj.task, traj.source) if self.with_info else ""
        return self.from_text(last["input"], last["output"], traj.source, info_prefix=info)

    def turn_examples(self, traj: Trajectory, label: float | None = None) -> list[Example]:
        """One example per assistant turn: the turn's prompt and response (with the information prefix), i.e. the
        state and action that a value function scores. `label` is given to every one of them."""
        info = self.info_prefix(traj.task, traj.source) if self.with_info else ""
        return [dataclasses.replace(self.from_text(m["input"], m["output"], f"{traj.source} turn {i}",
                                                   info_prefix=info), label=label)
                for i, m in enumerate(traj.dialogue) if m["role"] == "assistant"]

    def from_text(self, prompt: str, response: str, source: str, info_prefix: str = "") -> Example:
        """prompt: a templated prompt ending in the assistant generation header; response: the raw reply."""
        prompt = in_format(prompt, self.chat)  # an official Llama-3.1 prompt, for a model of another format
        text = info_prefix + prompt + response.rstrip() + self.chat.eot
        ids = np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)
        try:
            seg = self.fmt.segment(ids)
        except ValueError as e:
            raise DataError(f"{source}: field 'input': not in the {self.chat.name} chat format ({e})") from None
        if seg.roles[-1] != ASSISTANT:
            raise DataError(f"{source}: field 'input': the prompt must end with the assistant generation header")
        ids, seg, truncated = self._truncate(ids, seg, source)
        assistant = seg.official_assistant_mask if self.mask_style == "official" else seg.assistant_mask
        last_turn = seg.turns == seg.turns[-1]
        response = assistant & last_turn
        if self.score_span == "assistant":
            score = assistant
        elif self.score_span == "response":
            score = response
        else:
            score = np.ones(len(ids), bool)
            score[0] = False  # the first token has no prediction
        return Example(tokens=ids, score_mask=score, response_mask=response, turn_ids=seg.assistant_turns,
                       truncated=truncated, source=source)

    def _truncate(self, ids, seg, source):
        """Drop whole messages, oldest first, never the system message or the final assistant turn."""
        if len(ids) <= self.max_len:
            return ids, seg, False
        keep = np.ones(len(ids), bool)
        final = seg.turns[-1]
        droppable = [m for m in np.unique(seg.turns) if m >= 0 and m != final
                     and seg.roles[np.argmax(seg.turns == m)] != ROLE_IDS["system"]]
        for m in droppable:
            keep &= seg.turns != m
            if keep.sum() <= self.max_len:
                break
        if keep.sum() > self.max_len:
            raise DataError(f"{source}: over-long example: {len(ids)} tokens, and {int(keep.sum())} even with only the "
                            f"system message and the final assistant turn left; max_len is {self.max_len}")
        ids = ids[keep]
        return ids, self.fmt.segment(ids), True
