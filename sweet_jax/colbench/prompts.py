"""The agent and simulator prompts of the two ColBench tasks, in this project's own words: the same
content and constraints as the official prompt files. Imports no JAX."""

from __future__ import annotations

BACKEND_AGENT = """\
You are an agent helping a human write a Python function. The human has a specific, personal version of the problem \
in mind, and the request you receive leaves out details that only they know. Find those details by asking the human \
clarifying questions.

- Keep every question short and simple: the human answers in at most two sentences.
- You have at most 10 rounds of conversation in total, so be concise and ask about what matters most.
- When you are ready, start your message with "I WANT TO ANSWER:" and follow it with the complete function as raw \
Python code, with nothing else after it. That message ends the conversation."""

FRONTEND_AGENT = """\
You are an agent designing a web page for a human. Write a complete website with Tailwind CSS, wrapped in \
<html></html>, and fill it with real, full-length text rather than placeholders. For images, only use \
https://picsum.photos/id/48/W/H, choosing the width W and height H.

Every message you send may contain one HTML snippet. It is rendered, and the human compares a screenshot of it with \
the page they have in mind, then tells you how the two differ. The human sees only the rendered image: they do not \
read questions or any other text you write.

Write your thinking first, then "OUTPUT:" followed by the HTML. You have at most 10 rounds. When you are done, start \
your message with "I WANT TO ANSWER:"."""

SIMULATOR_SYSTEM = "You are a helpful assistant."

BACKEND_SIMULATOR = """\
Play the part of a human who asked an agent for help writing a Python function. Reply to the agent's last message as \
that human would.

The task you gave the agent:
{problem_description}

What only you know, as the code you have in mind (never show it, copy it or write any code):
{hidden_information}

Rules:
- Answer only from the information above. If the agent asks something it does not settle, say you do not know.
- Explain in plain language, in at most two sentences.

The conversation so far:
{dialogue_history}

Your reply, as the human:"""

FRONTEND_SIMULATOR = """\
You are a human who wants a web page built. The first image is a screenshot of the page the agent has built so far; \
the second image is the page you want. Describe, briefly and concretely, the most important differences between \
them (layout, colours, text, images, sizes) so that the agent can make its page look like yours. Do not describe \
anything that already matches."""

FRONTEND_NO_IMAGE = "(The agent has not given a page to look at yet: there is no first image.)"


def render_dialogue(history: list[dict]) -> str:
    """role:content blocks separated by blank lines, as the simulator sees the conversation."""
    return "\n\n\n\n".join(f"{m['role']}:{m['content']}" for m in history)
