"""Pre-training of the toy-scale science check : supervised fine-tuning of a random-init tiny Llama on the
SYNTHETIC "ask" domain (`sweet_jax.colbench.synthetic.write_ask_data`): scripted collaborations, and the simulated
human's replies. The result plays both parts in `configs/sweet_backend_tiny.py`: the agent (asks the good question,
the vague one, or answers at once, about a third of the time each) and the simulator (tells the constant when asked
for it).

The input embedding stays frozen at its random init (near-orthogonal rows make copying a constant a clean circuit);
the untied LM head is trained. Token-mean NLL on the last assistant turn of each record, over all records whatever
their reward.
"""

from sweet_jax.training.defaults import recipe_tiny


def get_config():
    c = recipe_tiny("sft", "pretrain_ask_tiny")
    c.model.preset_overrides.tie_word_embeddings = False
    c.data.kind = "rft"
    c.data.min_best_reward = 0.0  # every dialogue, not only the successful ones
    c.data.score_span = "response"  # a record per trained turn (see write_ask_data)
    c.data.eval_fraction = 0.05
    c.optim.lr = 1e-2
    c.optim.freeze = "embed"
    c.train.epochs = 2
    c.train.eval_every = 170
    c.train.checkpoint_every = 170  # each checkpoint holds the 8k x 64 head and its Adam moments
    return c
