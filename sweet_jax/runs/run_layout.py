"""Where each file of a pipeline run lies: the one map of a run directory, used by the stages that write it and by
the reports that read it.

    RUN/config.json                          the resolved config (`pipeline_config`)
    RUN/stages/NAME.json                     a finished stage's marker: outputs, wall time, summary
    RUN/logs/NAME.log                        a stage's log
    RUN/tasks/NAME.jsonl                     generated tasks: train_tasks, test_tasks, pretrain (dialogues)
    RUN/data/NAME.jsonl                      the offline data (train_trajectories) and the pair files
    RUN/gate/                                the testbed base's gate: its tasks and measurements
    RUN/STAGE/                               a training stage's run (log.jsonl, metrics.json, hf/, checkpoints/)
    RUN/bon/                                 the actor's candidates: sampled, ranked, paired
    RUN/eval/STAGE_trajectories.jsonl        an evaluation's episodes (.images/: their screenshots, frontend)
    RUN/eval/best_of_n.json                  the best-of-N evaluation (.trajectories.jsonl: its episodes;
                                             .states.jsonl: the testbed's candidates with their true values)
    RUN/eval/NAME.json                       the testbed's diagnostics and judges
    RUN/report/report.md                     the report, with its plots
    RUN/jax_cache/                           the stages' shared compilation cache

`RELATIVE` gives the same paths relative to a run directory: the stages declare their inputs and outputs with it.
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class RunLayout:
    root: str  # the run directory

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def config(self) -> str:
        return self.path("config.json")

    @property
    def logs(self) -> str:
        return self.path("logs")

    @property
    def jax_cache(self) -> str:
        return self.path("jax_cache")

    def tasks(self, name: str) -> str:
        """Generated tasks: train_tasks, test_tasks, or the pre-training dialogues (pretrain)."""
        return self.path("tasks", f"{name}.jsonl")

    @property
    def task_dir(self) -> str:
        return self.path("tasks")

    def data(self, name: str) -> str:
        """The offline data and what is made from it: train_trajectories, the pair files (critic_pairs, mtdpo_pairs,
        vision_pairs, vision_pairs_no_target), test_tasks (the scripted synthetic data's), collected_trajectories."""
        return self.path("data", f"{name}.jsonl")

    @property
    def data_dir(self) -> str:
        return self.path("data")

    @property
    def trajectories(self) -> str:
        """The offline trajectories on the train tasks."""
        return self.data("train_trajectories")

    @property
    def trajectory_screenshots(self) -> str:
        """The rendered pages of the offline trajectories (frontend)."""
        return self.trajectories + ".images"

    def gate(self, name: str) -> str:
        """A file of the testbed base's gate (tasks_qB.jsonl, gate_qB.json)."""
        return self.path("gate", name)

    def stage_dir(self, stage: str) -> str:
        """A training stage's run directory."""
        return self.path(stage)

    @property
    def markers(self) -> str:
        return self.path("stages")

    def marker(self, stage: str) -> str:
        return self.path("stages", f"{stage}.json")

    def finished(self) -> list[str]:
        """The stages with a marker, in the order they finished."""
        names = _stems(self.markers, ".json")
        return sorted(names, key=lambda name: os.path.getmtime(self.marker(name)))

    def log(self, stage: str) -> str:
        return self.path("logs", f"{stage}.log")

    def training_log(self, stage: str) -> str:
        """A training stage's metrics, one JSON object per logged point (`training.metrics_sink`)."""
        return self.path(stage, "log.jsonl")

    def export(self, stage: str) -> str:
        """A training stage's model as an HF checkpoint."""
        return self.path(stage, "hf")

    def metrics(self, stage: str) -> str:
        """A training stage's final metrics (held-out figures, steps, seconds)."""
        return self.path(stage, "metrics.json")

    def candidates(self, name: str) -> str:
        """The actor's candidates: sampled, ranked (by the critic; ranked_vision: by the vision critic), pairs."""
        return self.path("bon", f"{name}.jsonl")

    def episodes(self, stage: str) -> str:
        """An evaluation stage's episodes on the test tasks."""
        return self.path("eval", f"{stage}_trajectories.jsonl")

    def evaluated(self) -> list[str]:
        """The stages with episodes in RUN/eval, in the order of their files' names."""
        return _stems(self.evaluations, "_trajectories.jsonl")

    def screenshots(self, stage: str) -> str:
        """The rendered pages of a frontend evaluation's episodes."""
        return self.episodes(stage) + ".images"

    def screenshot(self, stage: str, page: str) -> str:
        """One of them, by its page hash (`colbench.render_cache.page_hash`)."""
        return os.path.join(self.screenshots(stage), page + ".png")

    @property
    def best_of_n(self) -> str:
        return self.path("eval", "best_of_n.json")

    @property
    def best_of_n_episodes(self) -> str:
        return self.best_of_n + ".trajectories.jsonl"

    @property
    def best_of_n_states(self) -> str:
        """The testbed's best-of-N candidates with their true values."""
        return self.best_of_n + ".states.jsonl"

    @property
    def evaluations(self) -> str:
        return self.path("eval")

    def evaluation(self, name: str) -> str:
        """An evaluation's figures (critic_diagnostics, policy_diagnostics, judges)."""
        return self.path("eval", f"{name}.json")

    @property
    def report(self) -> str:
        return self.path("report")

    @property
    def report_page(self) -> str:
        return report_file(self.report, "report.md")


def report_file(report_dir: str, name: str) -> str:
    """A file of a report directory (RUN/report, or the report command's --output): report.md, seeds.md, plots."""
    return os.path.join(report_dir, name)


def _stems(directory: str, suffix: str) -> list[str]:
    """The names of a directory's files that end in `suffix`, without it, in the order of the files' names ([] for
    no directory)."""
    if not os.path.isdir(directory):
        return []
    return [name[:-len(suffix)] for name in sorted(os.listdir(directory)) if name.endswith(suffix)]


RELATIVE = RunLayout("")  # the paths relative to a run directory
