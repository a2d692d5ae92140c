"""Driving one episode: the agent and the simulator behind OpenAI-compatible endpoints. Imports no
JAX."""

from __future__ import annotations

import asyncio
import dataclasses

import openai

from sweet_jax.colbench.client import LLMClient
from sweet_jax.colbench.env import Episode

NO_RESPONSE = "No response."  # the simulator's reply when its request is refused (a BadRequestError), as officially
API_MODES = ("completions", "chat")


@dataclasses.dataclass(frozen=True)
class AgentSampling:
    """How the agent is sampled. "completions" sends the chat-templated prompt as text, exactly what the
    trajectory's `input` records (the official pipeline's way); "chat" sends the messages and lets the server apply
    its own chat template (for endpoints without a completions API)."""

    api: str = "completions"
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024

    def __post_init__(self):
        if self.api not in API_MODES:
            raise ValueError(f"agent api must be one of {API_MODES}, got {self.api!r}")


@dataclasses.dataclass(frozen=True)
class SimulatorSampling:
    temperature: float = 0.0
    max_tokens: int = 4096


async def run_episode(episode: Episode, agent: LLMClient, simulator: LLMClient,
                      agent_sampling: AgentSampling = AgentSampling(),
                      simulator_sampling: SimulatorSampling = SimulatorSampling(), seed: int | None = None) -> dict:
    """Play `episode` to its end; returns its trajectory record (without a reward). With `seed`, the agent's turn t
    is sampled with seed `seed + t`: against a server whose samples depend only on prompt, settings and seed (the
    project's own), the same seed replays the same conversation."""
    kw = dict(temperature=agent_sampling.temperature, top_p=agent_sampling.top_p,
              max_tokens=agent_sampling.max_tokens)
    turn = 0
    while not episode.done:
        prompt = episode.agent_prompt()
        if seed is not None:
            kw["seed"] = (seed + turn) & 0x7FFFFFFF
        turn += 1
        if agent_sampling.api == "completions":
            raw = await agent.complete(prompt, **kw)
        else:
            raw = await agent.chat(episode.agent_messages(), **kw)
        # A frontend turn renders its page: a blocking call, kept off the event loop.
        done = await asyncio.to_thread(episode.step, raw, prompt) if episode.renders else episode.step(raw, prompt)
        if done:
            break
        try:
            reply = await simulator.chat(episode.simulator_messages(), temperature=simulator_sampling.temperature,
                                         max_tokens=simulator_sampling.max_tokens)
        except openai.BadRequestError:
            reply = NO_RESPONSE
        episode.add_reply(reply)
    return episode.record()
