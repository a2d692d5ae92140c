"""Files that a crash or a kill cannot leave half-written: atomic writes of files and directories (`atomic`), JSONL
records (`jsonl`), the append-only partial files that resumable jobs continue from (`partial`), `DataError`, the
error for bad input that names the file, line and field (`errors`), and the per-user cache of what is fetched or
derived once (`cache`). Imports no JAX."""
