"""Where each file of a pipeline run lies: the one map of a run directory, used by the stages that write it and by
the reports that read it.

    RUN/config.json                          the resolved config (`pipeline_config`)
    RUN/stages/NAME.json                     a finished stage's marker: outputs, wall time, summary
    RUN/logs/NAME.log                        a stage's log
    RUN/tasks/, RUN/data/                    generated tasks; the offline data and the pair files
    RUN/STAGE/                               a training stage's run (log.jsonl, metrics.json, hf/, checkpoints/)
    RUN/bon/                                 the actor's candidates: sampled, ranked, paired
    RUN/eval/STAGE_trajectories.jsonl        an evaluation's episodes (.images/: their screenshots, frontend)
    RUN/eval/best_of_n.json                  the best-of-N evaluation (.trajectories.jsonl: its episodes)
    RUN/eval/NAME.json                       the testbed's diagnostics and judges
    RUN/report/                              the report
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
    def markers(self) -> str:
        return self.path("stages")

    def marker(self, stage: str) -> str:
        return self.path("stages", f"{stage}.json")

    def log(self, stage: str) -> str:
        return self.path("logs", f"{stage}.log")

    def training_log(self, stage: str) -> str:
        """A training stage's metrics, one JSON object per logged point (`training.metrics_sink`)."""
        return self.path(stage, "log.jsonl")

    def export(self, stage: str) -> str:
        """A training stage's model as an HF checkpoint."""
        return self.path(stage, "hf")

    def candidates(self, name: str) -> str:
        """The actor's candidates: sampled, ranked (by the critic; ranked_vision: by the vision critic), pairs."""
        return self.path("bon", f"{name}.jsonl")

    def episodes(self, stage: str) -> str:
        """An evaluation stage's episodes on the test tasks."""
        return self.path("eval", f"{stage}_trajectories.jsonl")

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

    def evaluation(self, name: str) -> str:
        """An evaluation's figures (critic_diagnostics, policy_diagnostics, judges)."""
        return self.path("eval", f"{name}.json")

    @property
    def report(self) -> str:
        return self.path("report")


def report_file(report_dir: str, name: str) -> str:
    """A file of a report directory (RUN/report, or the report command's --output): report.md, seeds.md, plots."""
    return os.path.join(report_dir, name)
