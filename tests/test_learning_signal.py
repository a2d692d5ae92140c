"""The SWEET critic's learning signal, end to end through `python -m sweet_jax.train --config configs/critic_tiny.py`.

SYNTHETIC data (`colbench.synthetic`): the constant of each task's function lives only in the reference code, so a
critic that sees it (the training-time information) can learn which final answer is right, and the same recipe
without it cannot beat chance. Both runs use the config as shipped (the critic that the README's `train.sh` trains);
the control holds out 30% of the tasks instead of 10%, which measures its chance level to +-0.04 instead of +-0.07.
Only the final held-out score is read, so neither run scores the held-out split along the way (the training itself is
the same: the held-out passes change no parameter and draw no random number).
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
            f"--config.train.output_dir={out}", "--config.train.tensorboard=False", "--config.train.eval_every=0",
            *extra]


def _held_out_accuracy(done: subprocess.CompletedProcess) -> float:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["held_out"]["accuracy"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_critic_learns_from_the_information_and_stays_at_chance_without(tmp_path):
    # The two jobs run side by side: each keeps about 1.5 of 2 CPU cores busy. Without the information a critic
    # still learns priors over the constants from its training tasks, which are worth nothing on new tasks but sway
    # their pairs together: its held-out accuracy is chance plus the noise of the held-out tasks (one standard error
    # 0.5 / sqrt(tasks with a pair): 0.065 over the 80 tasks of a 10% split, where data seeds 0, 1, 2 gave 0.65,
    # 0.59, 0.45; 0.037 over the 240 of a 30% split)
    jobs = budget.run_side_by_side([_cmd(tmp_path / "with_info"),
                                    _cmd(tmp_path / "without_info", "--config.data.with_info=False",
                                         "--config.data.eval_fraction=0.3")], cwd=ROOT)
    with_info, without = (_held_out_accuracy(done) for done in jobs)
    print(f"held-out pair accuracy: {with_info:.3f} with the information, {without:.3f} without")
    assert with_info >= 0.9, f"with the information: {with_info:.3f}"
    assert abs(without - 0.5) <= 0.15, f"without the information: {without:.3f} (chance is 0.5)"
