"""Where a training job's metrics go: one sink feeding the progress bar (or, with no terminal, a log line), the
log, `log.jsonl` (every logged train and held-out point, one JSON object per line, for `sweet_jax.report` and for
scripts) and TensorBoard scalars under `tb/`. After a resume, steps past the restored checkpoint are logged again:
readers keep the last line per (split, step). Only process 0 writes files."""

from __future__ import annotations

import json
import logging
import os

from tqdm.auto import tqdm

log = logging.getLogger("sweet_jax.train")


class MetricsSink:
    def __init__(self, run_dir: str, *, leader: bool, total: int, start: int, desc: str, tensorboard: bool):
        self.total = total
        self.leader = leader
        self.writer = None
        if tensorboard and leader:
            from sweet_jax.training.tensorboard import ScalarWriter
            self.writer = ScalarWriter(os.path.join(run_dir, "tb"))
        self.lines = open(os.path.join(run_dir, "log.jsonl"), "a") if leader else None
        self.bar = tqdm(total=total, initial=start, desc=desc, disable=None if leader else True, dynamic_ncols=True)

    def _record(self, split: str, step: int, values: dict) -> None:
        if self.lines:
            self.lines.write(json.dumps({"split": split, "step": step, **values}) + "\n")
            self.lines.flush()
        if self.writer:
            for k, v in values.items():
                self.writer.add_scalar(f"{split}/{k}", v, step)

    def step_done(self) -> None:
        self.bar.update(1)

    def train(self, step: int, metrics: dict) -> None:
        """A logged training point: the bar's loss and accuracy (or a log line), log.jsonl, TensorBoard."""
        self.bar.set_postfix({k: f"{metrics[k]:.4f}" for k in ("loss", "accuracy") if k in metrics})
        if self.bar.disable and self.leader:  # no terminal: keep a plain log line instead of the bar
            log.info("step %d/%d %s", step, self.total, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        self._record("train", step, metrics)

    def held_out(self, step: int, metrics: dict) -> None:
        """A held-out evaluation during training."""
        log.info("step %d held-out %s", step, {k: round(v, 4) for k, v in metrics.items()})
        self._record("eval", step, metrics)

    def end_of_loop(self) -> None:
        self.bar.close()

    def final(self, metrics: dict) -> None:
        """The final held-out metrics; closes the files."""
        log.info("final held-out metrics: %s", {k: round(v, 4) for k, v in metrics.items()})
        self._record("eval", self.total, metrics)
        if self.lines:
            self.lines.close()
        if self.writer:
            self.writer.close()
