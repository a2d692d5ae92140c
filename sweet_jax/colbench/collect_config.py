"""The typed schema of a collection job (`python -m sweet_jax.collect`, configs/collect_*.py): every setting, its
default and its meaning, checked when the config loads (`CollectConfig.load`). The defaults are the official
settings: agent temperature 1.0, top-p 1, 1024 new tokens; simulator temperature 0, 4096 tokens; 10 agent turns.
Imports no JAX."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from sweet_jax.cli.schema import Section, section, setting
from sweet_jax.colbench.backend_eval import SEMANTICS
from sweet_jax.colbench.rollout import API_MODES


class EndpointSettings(Section):
    base_url: str = setting("http://127.0.0.1:8000/v1", "the server's OpenAI-compatible /v1 URL")
    model: str = setting("", "the served model's name")
    api_key_env: str = setting("OPENAI_API_KEY", "the environment variable the API key is read from")
    request_timeout: float = setting(300.0, "seconds per attempt")
    max_retries: int = setting(8, "retries on 429, 5xx, timeouts and dropped connections, with exponential backoff")
    backoff: float = setting(1.0, "seconds before the first retry")
    temperature: float = setting(1.0, "the sampling temperature")
    max_tokens: int = setting(1024, "new tokens per turn")


class AgentEndpoint(EndpointSettings):
    api: Literal[API_MODES] = setting("completions", "completions: the chat-templated prompt as text, as the "
                                                     "trajectory's `input` records it; chat: the messages")
    top_p: float = setting(1.0, "nucleus sampling's p")


class SimulatorEndpoint(EndpointSettings):
    base_url: str = setting("http://127.0.0.1:8001/v1", "the server's OpenAI-compatible /v1 URL")
    temperature: float = setting(0.0, "the sampling temperature")
    max_tokens: int = setting(4096, "new tokens per turn")


class CollectConfig(Section):
    task_type: Literal["backend", "frontend"] = setting("backend", "the ColBench track")
    tasks: str = setting("../shared/colbench/backend_test.jsonl",
                         "a local JSONL, or \"hub/dataset:path/in/repo.jsonl\"")
    limit: int = setting(0, "the first N tasks; 0: all")
    rollouts: int = setting(1, "conversations per task")
    output: str = setting("runs/rollouts/backend.jsonl", "the trajectories, in the official layout")
    max_steps: int = setting(10, "agent turns per conversation")
    seed: int | None = setting(0, "the agent's turn t of task i, rollout k is sampled with seed seed + 1000003 i + "
                                  "1009 k + t (None: the server's own random seeds)")
    concurrency: int = setting(32, "conversations in flight (and requests per endpoint)")
    evaluate: bool = setting(True, "score answers as they finish (`reward`)")
    semantics: Literal[tuple(SEMANTICS)] = setting("reference", "backend: how answers are scored "
                                                                "(`sweet_jax.evaluate`)")
    clip: str = setting("", "frontend: an HF CLIP checkpoint directory for the official metric; empty: the offline "
                            "pixel metric")
    render_workers: int = setting(2, "frontend: Chromium renderers working side by side")
    agent: AgentEndpoint = section(AgentEndpoint, "the policy being rolled out")
    simulator: SimulatorEndpoint = section(SimulatorEndpoint, "the simulated human")

    @model_validator(mode="after")
    def _check(self):
        if self.rollouts < 1 or self.concurrency < 1 or self.max_steps < 1:
            raise ValueError(f"rollouts, concurrency and max_steps must be >= 1, got {self.rollouts}, "
                             f"{self.concurrency}, {self.max_steps}")
        return self
