"""The typed schema of a pipeline run (`python -m sweet_jax.pipeline`): every setting of every track, its default
and its meaning, and the rules between them, checked when the config loads (`load_pipeline_config`), before any stage
runs. `task_type` picks the track's schema: `PipelineConfig` (backend), `FrontendPipelineConfig` (adds the official
frontend pairs and the vision-language critic), `TestbedPipelineConfig` (adds the testbed's settings, its shared base
and the diagnostics), `TestbedBaseConfig` (the testbed's shared base and its gate).

Config files stay Python ConfigDicts (configs/sweet_*.py); the run's config.json is the resolved config, defaults
included. The job configs a stage trains with (`critic.config` ...) are checked by their own schema when the stage's
job starts (`training.job_config`).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import model_validator

from sweet_jax.cli.schema import SchemaError, Section, section, setting
from sweet_jax.colbench.testbed_config import TestbedSection
from sweet_jax.inference.backends import BACKENDS

TASK_TYPES = ("backend", "frontend", "testbed", "testbed_base")


class InitSettings(Section):
    seed: int = setting(0, "the random init's seed")
    std: float = setting(0.1, "the random init's standard deviation")
    preset: str = setting("tiny", "the architecture (`models.preset`)")
    overrides: dict[str, Any] = setting(meaning="config fields changed from the preset's", factory=dict)
    tokenizer: str = setting("", "the tokenizer saved with it (a directory or bundled:NAME)")
    head_from_embed: bool = setting(False, "an untied LM head starts as the transposed embedding")


class TaskSettings(Section):
    kind: Literal["", "ask", "design", "testbed"] = setting(
        "", "the SYNTHETIC domain generated (backend: ask, frontend: design, testbed); \"\": none, give "
            "data.train_tasks and test_tasks")
    num_train: int = setting(400, "generated train tasks")
    num_test: int = setting(50, "generated held-out test tasks")
    num_constants: int = setting(4, "ask: the constants a hidden rule draws from")
    p_good: float = setting(1 / 3, "the scripted agent's share of good first moves (ask: the question that earns the "
                                   "constant; design: a draft first)")
    p_vague: float = setting(1 / 3, "the scripted agent's share of vague first moves")
    seed: int = setting(0, "the generator's seed")
    pretrain_episodes: int = setting(0, "testbed: the collecting policy's pre-training dialogues")
    pretrain_budgets: tuple[int, ...] = setting((), "testbed: the question budgets of the pre-training dialogues "
                                                    "(empty: testbed.budget's)")
    informed: bool = setting(False, "testbed: pre-training dialogues with the reference before them too")


class JobSettings(Section):
    config: str = setting("", "the job config file (configs/*.py); empty: the stage is skipped")
    overrides: tuple[str, ...] = setting((), "\"key=value\" overrides of it, passed as --config.key=value")


class AblationSettings(Section):
    overrides: tuple[str, ...] = setting((), "\"key=value\" overrides on top of the critic's recipe and overrides")


class SyntheticTrajectories(Section):
    num_tasks: int = setting(400, "tasks of the older constant-only domain's scripted trajectories")
    rollouts: int = setting(3, "trajectories per task")
    p_correct: float = setting(0.5, "the chance a trajectory's answer is right")
    seed: int = setting(0, "the generator's seed")
    num_constants: int = setting(4, "the constants an answer draws from")
    compact: bool = setting(True, "short dialogues")
    num_test_tasks: int = setting(20, "held-out tasks")


class DataSettings(Section):
    source: Literal["collect", "synthetic"] = setting(
        "collect", "collect: the initial policy against the simulator on the train tasks; synthetic: scripted "
                   "trajectories of the older constant-only domain, with no collection")
    train_tasks: str = setting("", "a task file; empty: the generated tasks")
    synthetic: SyntheticTrajectories = section(SyntheticTrajectories, "data.source = synthetic's trajectories")
    collector: Literal["scripted", "policy"] = setting(
        "scripted", "testbed: who collects the offline data, the scripted collecting policy or the initial policy "
                    "against the served scripted human")
    rollouts: int = setting(3, "testbed: collected rollouts per train task")


class CollectSettings(Section):
    limit: int = setting(320, "the first N train tasks (0: all)")
    rollouts: int = setting(3, "rollouts per task")
    max_steps: int = setting(3, "agent turns per episode")
    concurrency: int = setting(64, "episodes played at once")
    agent_max_tokens: int = setting(32, "tokens per agent turn")
    simulator_max_tokens: int = setting(16, "tokens per simulated-human turn")
    render_workers: int = setting(2, "frontend: the renderer's browser pages")
    clip: str = setting("", "frontend: a CLIP checkpoint directory for the similarity; empty: the offline pixel "
                            "metric")


class TestSettings(Section):
    rollouts: int = setting(2, "episodes per test task and method")
    limit: int = setting(0, "the first N test tasks (0: all)")


class ServingSettings(Section):
    max_model_len: int = setting(2048, "the servers' context length")
    max_batch: int = setting(16, "the project engine's decode slots")
    start_timeout_s: float = setting(300.0, "seconds a server may take to start")
    keep: bool = setting(False, "a server stays up for every later stage that serves the same model")
    release_for_training: bool = setting(False, "kept servers stop while a training stage runs (jobs = 1)")
    reruns_after_restart: int = setting(2, "a job that failed while a server it used was restarted runs again "
                                           "(resuming) this often")


class RoleSettings(Section):
    agent: str = setting("", "the agent (the policy being evaluated or collecting)")
    simulator: str = setting("", "the simulated human")
    sample: str = setting("", "best-of-N sampling")
    rank: str = setting("", "the critic ranking candidates")
    reference: str = setting("", "the frozen reference model")


class InferenceSettings(Section):
    backend: Literal[BACKENDS] = setting(
        "sweet_jax", "where inference runs (`inference.backends`): sweet_jax (the project's engine), vllm (`vllm "
                     "serve` on the role's HF export), endpoint (servers already running), describer")
    roles: RoleSettings = section(RoleSettings, "a backend per role, overriding `backend` (empty: `backend`)")
    endpoints: RoleSettings = section(RoleSettings, "backend endpoint: the role's /v1 URLs, comma-separated")
    role_args: RoleSettings = section(RoleSettings, "extra server arguments per role")
    mesh: str = setting("", "sweet_jax's device mesh, e.g. data=2,tensor=4")
    tensor_parallel_size: int = setting(1, "vLLM's tensor parallelism")
    dtype: str = setting("auto", "the servers' dtype")
    memory_fraction: float = setting(0.0, "the share of accelerator memory a server may take (0: its default)")
    vllm_python: str = setting("", "the vLLM environment's python (else $SWEET_JAX_VLLM_PYTHON)")
    extra_args: str = setting("", "extra arguments for every server")

    @model_validator(mode="after")
    def _check(self):
        for role, backend in self.roles.to_dict().items():
            if backend and backend not in BACKENDS:
                raise ValueError(f"inference.roles.{role}={backend!r}: expected one of {', '.join(BACKENDS)}")
        return self


class PipelineLoraSettings(Section):
    rank: int = setting(0, "rank > 0: every fine-tuning stage trains adapters of this rank on the frozen initial "
                           "policy (not the score-head critics); 0: the full model")
    alpha: float = setting(16.0, "the adapters' scale is alpha / rank")
    dropout: float = setting(0.0, "dropout on the adapters' input while training")
    compare_with: str = setting("", "another run of the same config and seed, which the report sets each method "
                                    "against, episode by episode")
    targets: str = setting("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                           "the adapted projections, PEFT's names, comma-separated")


class BestOfNEvalSettings(Section):
    enabled: bool = setting(True, "Figure 3a: each critic picks one of N sampled turns on the test tasks")
    ns: str = setting("1,2,4,8,16", "the Ns, comma-separated")
    repeats: int = setting(1, "draws per task and N")
    limit: int = setting(0, "the first N test tasks (0: all)")
    seed: int = setting(0, "the sampling seed")


class BestOfNSettings(Section):
    data_fraction: float = setting(0.1, "the share of the offline data's turns the actor's candidates come from")
    n: int = setting(16, "candidates per turn")
    temperature: float = setting(1.0, "their sampling temperature")
    max_tokens: int = setting(32, "tokens per candidate")
    batch: int = setting(8, "states sampled at once")


class RankSettings(Section):
    reference: Literal["sampler", "model"] = setting(
        "sampler", "the advantage's reference: the sampler's stored log-probs (official) or a model's")
    use_sum: bool = setting(False, "the summed log-prob ratio instead of the length-normalised one (an ablation)")
    no_info: bool = setting(False, "the critic ranks without the training-time information (an ablation)")
    no_header: bool = setting(False, "score the candidate alone, without its turn's assistant-header tokens")


class PairsSettings(Section):
    num_pairs: int = setting(4, "top-half vs bottom-half pairs per state")


class PipelineConfig(Section):
    """A backend run: the ask domain, or any backend tasks."""

    track: ClassVar[str] = "backend"
    domain: ClassVar[str] = "ask"  # the generated tasks' kind of this track

    task_type: Literal[TASK_TYPES] = setting("backend", "the track: backend, frontend, testbed or testbed_base")
    run_dir: str = setting("runs/pipeline", "where every stage writes")
    policy_init: str = setting("", "an HF directory or a Hub id (owner/name[@revision], downloaded into the Hub "
                                   "cache); empty: the pre-trained tiny model (or the random init)")
    simulator: str = setting("", "an HF directory or a Hub id served as the simulated human (or the id the "
                                 "describer or an endpoint serves); empty: the initial policy model")
    init: InitSettings = section(InitSettings, "the random init of the tiny model")
    tasks: TaskSettings = section(TaskSettings, "the generated tasks")
    pretrain: JobSettings = section(JobSettings, "pre-training on the domain's dialogues (empty config: none)")
    data: DataSettings = section(DataSettings, "the offline data")
    test_tasks: str = setting("", "a test task file; empty: the generated held-out tasks")
    collect: CollectSettings = section(CollectSettings, "collection (the offline data)")
    test: TestSettings = section(TestSettings, "the evaluation of every method on the test tasks")
    serve: ServingSettings = section(ServingSettings, "the model servers")
    inference: InferenceSettings = section(InferenceSettings, "where each inference role runs")
    compile_cache: bool = setting(True, "JAX's persistent compilation cache in RUN/jax_cache, shared by the stages")
    jobs: int = setting(1, "stages at a time where they do not depend on each other")
    critic: JobSettings = section(JobSettings, "the SWEET critic's job")
    critic_no_info: AblationSettings = section(AblationSettings, "the critic without the training-time information")
    critic_head: AblationSettings = section(AblationSettings, "the regression-head critic")
    critic_value: AblationSettings = section(AblationSettings, "the value-function critic")
    lora: PipelineLoraSettings = section(PipelineLoraSettings, "low-rank adapters in every fine-tuning stage")
    best_of_n_eval: BestOfNEvalSettings = section(BestOfNEvalSettings, "the critics' best-of-N evaluation")
    best_of_n: BestOfNSettings = section(BestOfNSettings, "the actor's candidates")
    rank: RankSettings = section(RankSettings, "ranking the candidates by the critic's advantage")
    pairs: PairsSettings = section(PairsSettings, "the actor's DPO pairs")
    policy: JobSettings = section(JobSettings, "the SWEET actor's job")
    rft: JobSettings = section(JobSettings, "rejection fine-tuning's job")
    mtdpo: JobSettings = section(JobSettings, "multi-turn DPO's job")

    @model_validator(mode="after")
    def _check_track(self):
        if self.task_type != self.track:
            raise ValueError(f"task_type={self.task_type!r} is not this schema's track ({self.track!r})")
        if self.tasks.kind not in ("", self.domain):
            raise ValueError(f"tasks.kind={self.tasks.kind!r}: a {self.track} run generates the {self.domain} domain "
                             f"(tasks.kind = {self.domain!r}), or none (\"\": give data.train_tasks and test_tasks)")
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")
        if self.lora.rank < 0:
            raise ValueError(f"lora.rank must be >= 0 (0: no adapters), got {self.lora.rank}")
        return self

    @property
    def shared_base(self) -> str:
        """A shared base's pre-trained model every run of this config starts from; "" for none."""
        return ""


class GtPairsSettings(Section):
    min_gap: float = setting(0.1, "two rollouts of a task pair up when their similarities differ by at least this "
                                  "(the official frontend rule)")


class VisionInitSettings(InitSettings):
    preset: str = setting("qwen2-vl-tiny", "the random-init vision-language critic's architecture")


class VisionSettings(Section):
    critic_init: str = setting("", "an HF directory the vision-language critic starts from; empty: the random init")
    init: VisionInitSettings = section(VisionInitSettings, "the random init")
    critic: JobSettings = section(JobSettings, "the vision-language critic's job")


class FrontendPipelineConfig(PipelineConfig):
    """A frontend run: the design domain, or any frontend tasks, with the text and the vision-language critic."""

    track: ClassVar[str] = "frontend"
    domain: ClassVar[str] = "design"

    task_type: Literal[TASK_TYPES] = setting("frontend", "the track")

    gt_pairs: GtPairsSettings = section(GtPairsSettings, "the official frontend pair files")
    vision: VisionSettings = section(VisionSettings, "the vision-language critic")
    critic_vision: AblationSettings = section(AblationSettings, "the vision critic's best-of-N evaluation")
    critic_vision_no_target: AblationSettings = section(AblationSettings, "the vision critic without the target "
                                                                          "screenshot")


class BaseSettings(Section):
    config: str = setting("", "the shared base's pipeline config (built once); empty: a base of this run's own")
    run_dir: str = setting("", "the shared base's run directory")
    overrides: tuple[str, ...] = setting((), "\"key=value\" overrides of its config")


class GateSettings(Section):
    tasks: int = setting(150, "held-out tasks per question budget of the base's gate")


class TestbedPipelineConfig(PipelineConfig):
    """A testbed run: SWEET-RL, its ablations and the baselines on the SYNTHETIC credit-assignment testbed."""

    track: ClassVar[str] = "testbed"
    domain: ClassVar[str] = "testbed"

    task_type: Literal[TASK_TYPES] = setting("testbed", "the track")

    testbed: TestbedSection = section(TestbedSection, "the testbed's setting (`colbench.testbed_domain`)")
    base: BaseSettings = section(BaseSettings, "the shared base every seed starts from")
    judges: bool = setting(True, "the judges stage: both ranking references against the exact values")
    drop: tuple[str, ...] = setting((), "stages this run leaves out")
    gate: GateSettings = section(GateSettings, "the base's gate")

    @property
    def shared_base(self) -> str:
        return os.path.join(os.path.abspath(self.base.run_dir), "pretrain", "hf") if self.base.config else ""


class TestbedBaseConfig(TestbedPipelineConfig):
    """The testbed's shared base: pre-training and its gate."""

    track: ClassVar[str] = "testbed_base"

    task_type: Literal[TASK_TYPES] = setting("testbed_base", "the track")


SCHEMAS: dict[str, type[PipelineConfig]] = {s.track: s for s in (PipelineConfig, FrontendPipelineConfig,
                                                                   TestbedPipelineConfig, TestbedBaseConfig)}


def load_pipeline_config(config, source: str = "") -> PipelineConfig:
    """The typed config of a pipeline run (a config file's ConfigDict, a dict from config.json, or already typed),
    by its `task_type`; `SchemaError` names the file, line, field and rule."""
    if isinstance(config, PipelineConfig):
        return config
    task_type = config.get("task_type", PipelineConfig.model_fields["task_type"].default) if hasattr(
        config, "get") else None
    if task_type not in SCHEMAS:
        raise SchemaError(f"{source + ': ' if source else ''}field 'task_type': input should be one of "
                          f"{', '.join(map(repr, SCHEMAS))}, got {task_type!r}")
    return SCHEMAS[task_type].load(config, source=source)
