"""The SWEET critic's learning signal, end to end through `python -m sweet_jax.train --config configs/critic_tiny.py`.

SYNTHETIC data (`colbench.synthetic`): the constant of each task's function lives only in the reference code, so a
critic that sees it (the training-time information) can learn which final answer is right, and the same recipe
without it cannot beat chance. Both runs use the config exactly as shipped: this is the README's main job.
"""

import json
import os
import subprocess
import sys

import budget
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(out, *extra) -> list[str]:
    return [sys.executable, "-m", "sweet_jax.train", "--config", os.path.join(ROOT, "configs", "critic_tiny.py"),
            f"--config.train.output_dir={out}", "--config.train.tensorboard=False", *extra]


def _held_out_accuracy(done: subprocess.CompletedProcess) -> float:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["held_out"]["accuracy"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_critic_learns_from_the_information_and_stays_at_chance_without(tmp_path):
    # the two jobs run side by side: each keeps about 1.5 of 2 CPU cores busy
    jobs = budget.run_side_by_side([_cmd(tmp_path / "with_info"),
                                    _cmd(tmp_path / "without_info", "--config.data.with_info=False")], cwd=ROOT)
    with_info, without = (_held_out_accuracy(done) for done in jobs)
    print(f"held-out pair accuracy: {with_info:.3f} with the information, {without:.3f} without")
    assert with_info >= 0.9, f"with the information: {with_info:.3f}"
    assert abs(without - 0.5) <= 0.15, f"without the information: {without:.3f} (chance is 0.5)"
