"""ColBench task tools: `python -m sweet_jax.tasks generate --source EXCERPTS --output TASKS.jsonl --model M ...`.

generate: new backend tasks written by an LLM from web-text excerpts, each kept only if its ground truth passes its
own tests in the sandbox (see `sweet_jax.colbench.task_writer`). EXCERPTS is a JSONL file whose records hold the text in
`--text-field` (default "text", as in DCLM), or a plain-text file with one excerpt per line. Resumable: rerun the same
command after a crash. Prints {"kept", "rejected", "skipped_done"}.
"""

from sweet_jax.cli.app import run
from sweet_jax.colbench.sandbox import SandboxUnavailable
from sweet_jax.colbench.task_writer import TaskGenerationSettings, generate_tasks
from sweet_jax.files.errors import DataError

if __name__ == "__main__":
    run(None, subcommands={"generate": (TaskGenerationSettings, generate_tasks)},
        errors=(DataError, SandboxUnavailable))
