"""SWEET-RL steps 3 to 5 and the best-of-N evaluation, on the project's own JAX model (`sweet_jax.ranking.candidates`,
`sweet_jax.ranking.selection`):

    python -m sweet_jax.best_of_n sample --model POLICY --input TRAJ.jsonl --output SAMPLED.jsonl [--data-fraction 0.1]
    python -m sweet_jax.best_of_n rank --critic CRITIC --input SAMPLED.jsonl --output RANKED.jsonl \\
        [--kind critic|head|value|llm] [--reference sampler|model] [--reference-model REF] [--no-info] [--use-sum]
        [--no-header]
    python -m sweet_jax.best_of_n rank_vision --critic VISION_CRITIC --input SAMPLED.jsonl --output RANKED.jsonl \
        [--no-target] [--renders DIR]           (frontend: every candidate's page rendered and judged by its look)
    python -m sweet_jax.best_of_n pairs --input RANKED.jsonl --output PAIRS.jsonl [--num-pairs 4] [--no-prompt]
    python -m sweet_jax.best_of_n evaluate --policy POLICY --simulator SIM --tasks TEST_TASKS.jsonl \\
        --output BEST_OF_N.json --judge "sweet=CRITIC" [--judge "no_info=CRITIC2:no-info"] [--ns 1,2,4,8,16]

`python -m sweet_jax.best_of_n SUBCOMMAND --help` lists a subcommand's flags. Prints the summary as JSON; exit 2 for
bad input. sample, rank, rank_vision and evaluate resume after a kill.
"""

from sweet_jax.cli.app import run
from sweet_jax.files.errors import DataError
from sweet_jax.models.loading import ModelLoadError
from sweet_jax.ranking import candidates, selection, vision_critic

SUBCOMMANDS = {
    "sample": (candidates.SampleSettings, candidates.sample),
    "rank": (candidates.RankSettings, candidates.rank),
    "rank_vision": (vision_critic.RankVisionSettings, vision_critic.rank_vision),
    "pairs": (candidates.PairsSettings, candidates.pairs),
    "evaluate": (selection.SelectionSettings, selection.evaluate),
}

if __name__ == "__main__":
    run(None, subcommands=SUBCOMMANDS, errors=(DataError, ModelLoadError))
