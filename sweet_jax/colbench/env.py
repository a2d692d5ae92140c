"""ColBench episodes: the turn-taking rules of the two tasks, with no I/O of their own. Imports no
JAX.

An episode holds the dialogue. The rollout driver (`colbench.rollout`) asks it for the agent's prompt, hands it the
agent's raw response (`step`), and, unless the episode ended, asks it for the simulator's request and hands back the
reply (`add_reply`). The rules:

- The user (simulator) speaks first: the task's problem description.
- At most `max_steps` (10) agent turns.
- A response containing "OUTPUT:" is cut to the text after the first marker (and before a second one); only that
  part goes back into later prompts.
- A turn whose processed response contains "I WANT TO ANSWER:", or the last allowed turn, ends the episode. The
  history then ends with that agent turn.
- Simulator replies are cut to 400 characters (backend) or 1000 (frontend).
- Backend answer: the text after the answer marker (up to a second one), or, when the turn limit ends the episode,
  the whole last response; "No answer" otherwise.
- Frontend answer: every agent turn is searched for HTML, which is rendered at once; the answer is the screenshot of
  the last rendered page, whichever turn it came from ("No answer" if none). When the target page cannot be
  rendered, the episode ends after the first agent turn.
"""

from __future__ import annotations

from typing import Callable

from sweet_jax.chat import ChatFormat, get_format
from sweet_jax.colbench import prompts
from sweet_jax.colbench.html import extract_html

ANSWER_MARKER = "I WANT TO ANSWER:"
OUTPUT_MARKER = "OUTPUT:"
MAX_STEPS = 10
NO_ANSWER = "No answer"


def split_output(raw: str) -> tuple[str, str]:
    """(content, output): the part after the first OUTPUT: (before a second one), and the raw response cut before a
    second OUTPUT:. Without the marker both are the raw response."""
    parts = raw.split(OUTPUT_MARKER)
    if len(parts) == 1:
        return raw, raw
    return parts[1], OUTPUT_MARKER.join(parts[:2])


class Episode:
    """One conversation on one task. Subclasses set the prompts, the reply limit and how answers are found."""

    agent_prompt_text: str = ""
    reply_limit: int = 0
    renders: bool = False  # whether step() renders pages (blocking work the rollout driver runs off its event loop)

    def __init__(self, task: dict, max_steps: int = MAX_STEPS, date_header: bool = True,
                 chat_format: ChatFormat | None = None):
        self.task = task
        self.chat = chat_format or get_format()  # how the agent's prompt is written (`sweet_jax.chat`)
        self.max_steps = max_steps
        self.date_header = date_header
        self.history: list[dict] = [{"role": "user", "content": task["problem_description"]}]
        self.steps = 0
        self.done = False
        self.answer = NO_ANSWER

    # ------------------------------------------------------------------ the agent's side
    def agent_messages(self) -> list[dict]:
        return [{"role": "system", "content": self.agent_prompt_text}] + [
            {"role": m["role"], "content": m["content"]} for m in self.history]

    def agent_prompt(self) -> str:
        """The chat-templated prompt (with the generation prompt): what the agent is given, and what the trajectory
        stores as the turn's `input`."""
        return self.chat.render_text(self.agent_messages(), add_generation_prompt=True, date_header=self.date_header)

    def step(self, raw: str, prompt: str | None = None) -> bool:
        """Record the agent's raw response; returns whether the episode ended."""
        if self.done:
            raise RuntimeError("step() on a finished episode")
        content, output = split_output(raw)
        self.history.append({"role": "assistant", "content": content,
                             "input": self.agent_prompt() if prompt is None else prompt, "output": output})
        self.steps += 1
        self._on_turn(content)
        if ANSWER_MARKER in content or self.steps >= self.max_steps:
            self.done = True
            self._on_end(content)
        return self.done

    def _on_turn(self, content: str) -> None:
        pass

    def _on_end(self, content: str) -> None:
        pass

    # ------------------------------------------------------------------ the simulator's side
    def simulator_messages(self) -> list[dict]:
        raise NotImplementedError

    def add_reply(self, text: str) -> None:
        if self.done:
            raise RuntimeError("add_reply() on a finished episode")
        self.history.append({"role": "user", "content": text[:self.reply_limit]})

    def record(self) -> dict:
        """The official trajectory record (without `reward`)."""
        return {"task": self.task, "dialogue_history": self.history, "answer": self.answer}


class BackendEpisode(Episode):
    agent_prompt_text = prompts.BACKEND_AGENT
    reply_limit = 400

    def _on_end(self, content: str) -> None:
        if ANSWER_MARKER in content:
            self.answer = content.split(ANSWER_MARKER)[1]
        else:  # the turn limit: the whole last response is the answer
            self.answer = content

    def simulator_messages(self) -> list[dict]:
        task = self.task
        text = prompts.BACKEND_SIMULATOR.format(
            problem_description=task["problem_description"],
            hidden_information=task["ground_truth"],  # the official code gives the simulator the ground truth
            dialogue_history=prompts.render_dialogue(self.history))
        return [{"role": "system", "content": prompts.SIMULATOR_SYSTEM}, {"role": "user", "content": text}]


class FrontendEpisode(Episode):
    """`render(html) -> path of a PNG screenshot, or None on failure`; `image_url(path) -> a URL the simulator
    accepts` (a base64 data URL: `colbench.client.png_data_url`)."""

    agent_prompt_text = prompts.FRONTEND_AGENT
    reply_limit = 1000
    renders = True

    def __init__(self, task: dict, render: Callable[[str], str | None], image_url: Callable[[str], str],
                 max_steps: int = MAX_STEPS, date_header: bool = True, chat_format: ChatFormat | None = None):
        super().__init__(task, max_steps, date_header, chat_format)
        self.render = render
        self.image_url = image_url
        self.target_image = render(task["ground_truth"])
        self.latest_image: str | None = None  # the screenshot of the last page the agent gave

    def step(self, raw: str, prompt: str | None = None) -> bool:
        done = super().step(raw, prompt)
        if not done and self.target_image is None:  # the target never rendered: nothing to compare against
            self.done = True
        return self.done

    def _on_turn(self, content: str) -> None:
        html = extract_html(content)
        if html is not None:
            image = self.render(html)
            if image is not None:
                self.latest_image = image
                self.answer = image

    def simulator_messages(self) -> list[dict]:
        parts: list[dict] = [{"type": "text", "text": prompts.FRONTEND_SIMULATOR}]
        if self.latest_image is None:
            parts.append({"type": "text", "text": prompts.FRONTEND_NO_IMAGE})
        else:
            parts.append({"type": "image_url", "image_url": {"url": self.image_url(self.latest_image)}})
        parts.append({"type": "image_url", "image_url": {"url": self.image_url(self.target_image)}})
        return [{"role": "user", "content": parts}]
