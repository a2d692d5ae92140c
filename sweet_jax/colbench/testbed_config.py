"""The typed settings of the SYNTHETIC credit-assignment testbed: its domain (`TestbedSection`, the typed face of
`testbed_domain.TestbedSettings`, whose defaults and ranges these are), read by the testbed pipeline's config, and the
`python -m sweet_jax.testbed` command's config (`TestbedConfig`, configs/testbed_tiny.py). Imports no JAX."""

from __future__ import annotations

from pydantic import model_validator

from sweet_jax.cli.schema import Section, section, setting
from sweet_jax.colbench import testbed_domain as domain


class CollectorSection(Section):
    p_answer: float = setting(domain.CollectorSettings.p_answer, "before its last turn, it answers at once")
    p_vague: float = setting(domain.CollectorSettings.p_vague, "it asks the vague question")
    cue_weight: float = setting(domain.CollectorSettings.cue_weight, "a cued term is this many times as likely to "
                                                                      "be asked about as an uncued one")
    p_guess: float = setting(domain.CollectorSettings.p_guess, "its answer guesses a cued term it was not told")


class TestbedSection(Section):
    """`colbench.testbed_domain.TestbedSettings`, whose defaults and ranges these are."""

    details: int = setting(domain.TestbedSettings.details, "hidden coefficients per task (terms of degree 0 .. "
                                                           "details - 1)")
    values: int = setting(domain.TestbedSettings.values, "the nonzero coefficients a used term draws from")
    budget: int = setting(domain.TestbedSettings.budget, "questions before the answer")
    p_use: float = setting(domain.TestbedSettings.p_use, "the prior probability that a task uses each term")
    cue_noise: float = setting(domain.TestbedSettings.cue_noise, "the probability that the request's cue of a term "
                                                                 "is flipped")
    outcome_noise: float = setting(domain.TestbedSettings.outcome_noise, "the probability that a collected "
                                                                         "trajectory's recorded reward is flipped")
    tell_budget: bool = setting(domain.TestbedSettings.tell_budget, "the request says how many questions the human "
                                                                    "answers (one agent for every budget)")
    collector: CollectorSection = section(CollectorSection, "the scripted data-collecting policy")

    @model_validator(mode="after")
    def _check(self):
        self.domain_settings()  # the domain's range checks
        return self

    def domain_settings(self) -> domain.TestbedSettings:
        return domain.TestbedSettings.from_config(self.to_dict())


class TestbedConfig(Section):
    run_dir: str = setting("runs/testbed_tiny", "where the command's outputs go")
    seed: int = setting(0, "the tasks' and the policy's seed (--seed overrides it)")
    episodes: int = setting(400, "episodes per policy for `testbed oracle` / `random`: a standard error of 2.5 points "
                                 "at 50%")
    testbed: TestbedSection = section(TestbedSection, "the domain's setting")
