"""The testbed's shared base model: `python -m sweet_jax.pipeline --config configs/testbed_base_tiny.py`, in
runs/testbed_base_tiny. Every seed and sweep cell of configs/sweet_testbed_tiny.py and
configs/sweet_testbed_sweep_tiny.py starts from it (their first stage runs this pipeline, which skips what is done), as every run of the paper starts
from one instruct LLM.

SYNTHETIC (`sweet_jax.colbench.testbed_domain`). A random-init tiny Llama (configs/sweet_backend_tiny.py's `init`) is
pre-trained (configs/pretrain_testbed_tiny.py with the overrides below) on episodes of tasks of its own, a third each
with 1, 2 and 3 questions before the answer (each request says its number, `tell_budget`):
- the scripted collecting policy's turns, so it speaks the domain, copies what it was told and starts near the
  collector;
- the same turns in the critic's layout, "In light that the final answer is: <hidden code>." before the dialogue,
  with the answer turn replaced by the hidden code (`testbed_diagnostics.informed_records`): with the reference in
  its context, it learns that the matching answer is the likely one, as an instruct LLM reads it.

Then the gate (`python -m sweet_jax.testbed gate`, RUN/gate/gate_qB.json for B = 1, 2, 3) measures both skills on
held-out tasks of a seed of their own, before any method runs: the share of its answers that copy every told
coefficient, and the untrained base as a judge, log p0(a | c, h) - log p0(a | h), against the ground truth.
"""

import ml_collections

from sweet_jax.training.defaults import derived_from

BASE_SEED = 1000  # the base's own task streams: not the seeds (0, 1, ...) of the runs that use it


def get_config():
    c = derived_from(__file__, "sweet_backend_tiny.py")
    testbed = derived_from(__file__, "sweet_testbed_tiny.py")
    c.task_type = "testbed_base"
    c.run_dir = "runs/testbed_base_tiny"
    c.testbed = testbed.testbed
    c.init.seed = 0
    c.tasks = ml_collections.ConfigDict(dict(kind="testbed", num_train=0, num_test=0, pretrain_episodes=4500,
                                             pretrain_budgets=(1, 2, 3), informed=True, seed=BASE_SEED))
    c.pretrain.config = "configs/pretrain_testbed_tiny.py"
    # 2 epochs (5,048 steps, 17 minutes on the 2-core CPU), the embedding trained too ("optim.freeze="): at step
    # 1,000 the agent copied every told coefficient in 61% of its answers with it, 50% with the embedding frozen
    # (the first setting's recipe; 63% after 3 epochs, 44% at step 1,750 with 4 layers)
    c.pretrain.overrides = ("train.epochs=2", "train.eval_every=1000", "train.checkpoint_every=500", "optim.freeze=")
    c.gate = ml_collections.ConfigDict(dict(tasks=150))  # held-out tasks per budget
    return c
