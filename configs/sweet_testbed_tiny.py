"""SWEET-RL on the SYNTHETIC credit-assignment testbed, one seed on the CPU:
`python -m sweet_jax.pipeline --config configs/sweet_testbed_tiny.py[:S]` (S, the seed: 0 by default).

SYNTHETIC tasks, not ColBench (`sweet_jax.colbench.testbed_domain`): each task wants a polynomial whose coefficients
are hidden details; the request cues, with noise, which terms it has; the agent may ask about 2 terms before it must
answer; a vague question wastes a turn. Every turn's true value (Q* and Q under the collecting policy) is exact, so the
diagnostics measure every judge and every policy against the ground truth. The domain's settings are those of
configs/testbed_tiny.py: the optimal policy succeeds 49.8% of the time, the scripted collecting policy 24.3%.

As in the paper:
- **One base for every seed**, with the skills an instruct LLM brings (configs/testbed_base_tiny.py, its gate in
  docs/science.md): it copies what it was told into its answer, and with the reference solution before the dialogue
  it finds the matching answer likely. The first seed's run builds it (about 21 minutes, once); every later run
  finds it done.
- **The initial policy collects the offline data** (`data.collector = "policy"`): the base plays the agent against
  the scripted human (served over the OpenAI API by `python -m sweet_jax.describer --domain testbed`), 3 rollouts on
  each of 400 train tasks; 10% of the recorded rewards are flipped (outcome noise). The candidates the critic ranks
  and the baselines' starting point are the same model.
- **The official recipe values**: the critic's beta 0.1 (the tiny critic's 1.0 before), NLL weight 0.01 for both DPO
  methods (1.0 before), with their learning rate 3e-4 (1e-3 before; see below). The toy-scale settings of configs/sweet_backend_tiny.py otherwise: learning rates, epochs,
  the frozen embedding and LM head, the candidates scored without their header tokens.
- **Both ranking references in the diagnostics** (stage `judges`): the official one (the sampler's log-probs
  without the information) ranks the actor's candidates; the paper's Eq. 3 (the frozen base on the critic's own
  text) is measured beside it.

Seeds: `:S` after the file's name sets the seed of the tasks, the data, the best-of-N sampling and the run directory,
runs/sweet_testbed_tiny/seed_S. `python -m sweet_jax.report runs/sweet_testbed_tiny/seed_*` pools the seeds, with
paired differences. The sweep over the testbed's dials: configs/sweet_testbed_sweep_tiny.py. The first setting (a
per-seed agent pre-trained on the scripted collector's turns, scripted offline data): configs/
sweet_testbed_scripted_tiny.py.
"""

import ml_collections

from sweet_jax.training.defaults import derived_from

# the testbed's default setting (configs/testbed_tiny.py); `budget` is the number of questions before the answer
# (`tell_budget`: each request says it, so that one base serves 1, 2 and 3 questions)
TESTBED = dict(details=4, values=3, budget=2, p_use=0.5, cue_noise=0.2, outcome_noise=0.1, tell_budget=True,
               collector=dict(p_answer=0.2, p_vague=0.1, cue_weight=3.0, p_guess=0.5))


def seed_of(config: str, arg: str) -> int:
    try:
        return int(arg)
    except ValueError:
        raise ValueError(f"configs/{config}:{arg}: the seed after ':' must be an integer") from None


def get_config(seed: str = "0"):
    seed = seed_of("sweet_testbed_tiny.py", seed)
    c = derived_from(__file__, "sweet_backend_tiny.py")
    c.task_type = "testbed"
    c.run_dir = f"runs/sweet_testbed_tiny/seed_{seed}"
    c.simulator = "testbed-human"  # the id the scripted human is served under
    c.inference.roles.simulator = "describer"
    c.inference.role_args = ml_collections.ConfigDict(dict(simulator="--domain testbed"))
    c.testbed = ml_collections.ConfigDict(TESTBED)
    budget = c.testbed.budget
    # the shared base, built once in its own run directory
    c.base = ml_collections.ConfigDict(dict(config="configs/testbed_base_tiny.py", run_dir="runs/testbed_base_tiny",
                                            overrides=()))
    c.pretrain.config = ""  # the base is pre-trained in its own run
    c.tasks = ml_collections.ConfigDict(dict(kind="testbed", num_train=400, num_test=100, pretrain_episodes=0,
                                             seed=seed))
    c.data = ml_collections.ConfigDict(dict(collector="policy", rollouts=3, train_tasks=""))
    # max_steps: the questions and the answer (testbed.budget + 1); the longest answer is about 40 tokens
    c.collect.update(limit=0, max_steps=budget + 1, agent_max_tokens=48, simulator_max_tokens=24)
    c.test = ml_collections.ConfigDict(dict(rollouts=1))  # 100 episodes per method and seed, paired across methods
    # best-of-N (a diagnostic: no method trains or is evaluated on it) on the first 50 of the 100 test tasks: on all
    # 100 it took 410 s after the value function's 229, and seed 0 took 978 s in all
    c.best_of_n_eval.update(seed=seed, limit=50)
    c.best_of_n.max_tokens = 48
    c.critic.overrides = (*c.critic.overrides, "loss.beta=0.1")
    official_nll = "loss.nll_coef=0.01"
    # Both DPO methods at learning rate 3e-4 (the tiny configs' 1e-3 before): with the official NLL weight at 1e-3,
    # seed 0's SWEET actor wrote degenerate answers ("I WANT TO ANSI WANT TO ANS...", 51% in the domain's form);
    # 3e-4 is the largest of 1e-3, 3e-4 and 1e-4 whose actor answers in form as often as the base (99%, the base
    # 98%), judged on form alone (docs/science.md, "A deviation")
    dpo_lr = "optim.lr=3e-4"
    c.policy.overrides = (*(official_nll if o.startswith("loss.nll_coef=") else o for o in c.policy.overrides),
                          dpo_lr)
    c.mtdpo.overrides = (*(official_nll if o.startswith("loss.nll_coef=") else o for o in c.mtdpo.overrides), dpo_lr)
    c.judges = True
    c.drop = ()
    return c
