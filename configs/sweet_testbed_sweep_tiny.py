"""One cell of the testbed's sweep: configs/sweet_testbed_tiny.py with one dial moved, one seed on the CPU:
`python -m sweet_jax.pipeline --config configs/sweet_testbed_sweep_tiny.py:DIAL=VALUE,S`, in
runs/sweet_testbed_sweep_tiny/DIAL_VALUE/seed_S. SYNTHETIC (`sweet_jax.colbench.testbed_domain`).

The dials (the main setting's value first):
- `rollouts`: offline episodes per train task, 3 or 10 (1,200 or 4,000 trajectories);
- `noise`: the share of recorded rewards flipped, 0.1 or 0;
- `questions`: questions before the answer (the decisions before the one that is scored), 2, 1 or 3; the shared
  base (configs/testbed_base_tiny.py) was pre-trained on all three, and each request says its number.

A cell runs only what its comparison uses: the SWEET critic and actor, rejection fine-tuning, multi-turn DPO, the
zero-shot policy, and the critic's ranking against the ground truth (stage `judges`). The critic ablations, best-of-N
and the actor's ablations are left out (`drop`). `python -m sweet_jax.report runs/sweet_testbed_sweep_tiny/DIAL_VALUE/
seed_*` pools a cell's seeds.
"""

from sweet_jax.training.defaults import derived_from

DIALS = {"rollouts": (3, 10), "noise": (0.1, 0.0), "questions": (2, 1, 3)}
DROPPED = ("critic_no_info", "critic_head", "critic_value", "best_of_n", "rank_no_info", "policy_no_info",
           "test_no_info", "rank_sum", "policy_sum", "test_sum")


def get_config(cell: str = "rollouts=10,0"):
    where = f"configs/sweet_testbed_sweep_tiny.py:{cell}"
    dial, _, rest = cell.partition("=")
    value, _, seed = rest.partition(",")
    if dial not in DIALS:
        raise ValueError(f"{where}: the dial must be one of {', '.join(DIALS)} (e.g. :rollouts=10,0)")
    try:
        number = float(value)
    except ValueError:
        number = None
    if number not in DIALS[dial]:
        raise ValueError(f"{where}: {dial} takes {' or '.join(map(str, DIALS[dial]))}, got {value!r}")
    c = derived_from(__file__, "sweet_testbed_tiny.py")
    try:
        seed_value = int(seed) if seed else 0
    except ValueError:
        raise ValueError(f"{where}: the seed after ',' must be an integer") from None
    c.tasks.seed = c.best_of_n_eval.seed = seed_value
    c.run_dir = f"runs/sweet_testbed_sweep_tiny/{dial}_{value}/seed_{seed_value}"
    if dial == "rollouts":
        c.data.rollouts = int(number)
    elif dial == "noise":
        c.testbed.outcome_noise = number
    else:
        budget = int(number)
        c.testbed.budget = budget
        c.collect.max_steps = budget + 1
    c.drop = DROPPED
    return c
