#!/usr/bin/env python3
"""Submit one command as a multi-host JAX job on a SLURM GPU cluster: one process per node, owning all its GPUs.

    python launch/slurm.py --nodes 2 --gpus-per-node 8 [--partition P] [--time 24:00:00] [--account A] \\
        [--dry-run] -- python -m sweet_jax.train --config configs/critic_8b.py --config.mesh.fsdp=-1

It writes an sbatch script (under --script-dir) and submits it with `sbatch`; `--dry-run` prints the script instead.
In the job, every task gets what `sweet_jax.parallel.distributed.initialize` reads: JAX_COORDINATOR_ADDRESS (the
first node of the allocation, port --port), JAX_NUM_PROCESSES ($SLURM_NTASKS) and JAX_PROCESS_ID ($SLURM_PROCID). `srun
--kill-on-bad-exit` ends the whole step when one task fails. The job is requeued on preemption or node failure and
the trainer resumes from its last checkpoint, so a requeued job loses at most `train.checkpoint_every` steps.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sweet_jax.parallel.distributed import env as jax_env  # noqa: E402  (stdlib-only import: no jax needed here)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--cpus-per-task", type=int, default=None)
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--time", default=None, help="wall-clock limit, e.g. 24:00:00")
    p.add_argument("--job-name", default="sweet_jax")
    p.add_argument("--port", type=int, default=12321, help="coordinator port on the first node")
    p.add_argument("--repo-dir", default=REPO, help="the repository's path on the nodes (default: this checkout)")
    p.add_argument("--venv", default=".venv", help="virtual environment inside --repo-dir (from launch/setup.sh)")
    p.add_argument("--log-dir", default="logs/slurm", help="job output, relative to --repo-dir")
    p.add_argument("--script-dir", default=None, help="where the sbatch script is written (default: --log-dir)")
    p.add_argument("--sbatch-arg", action="append", default=[], help="extra #SBATCH line, e.g. --sbatch-arg=--qos=high")
    p.add_argument("--no-requeue", action="store_true", help="do not requeue the job after a preemption")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch script, submit nothing")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every node runs")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("give the command after --, e.g. -- python -m sweet_jax.train --config configs/critic_8b.py")
    if args.nodes < 1 or args.gpus_per_node < 1:
        p.error("--nodes and --gpus-per-node must be positive")
    return args


def sbatch_script(args) -> str:
    directives = [f"--job-name={args.job_name}", f"--nodes={args.nodes}", "--ntasks-per-node=1",
                  f"--gpus-per-node={args.gpus_per_node}", f"--output={args.log_dir}/%x-%j.out",
                  "--open-mode=append"]
    directives += [f"--{k}={v}" for k, v in (("cpus-per-task", args.cpus_per_task), ("partition", args.partition),
                                              ("account", args.account), ("time", args.time)) if v]
    if not args.no_requeue:
        directives.append("--requeue")
    directives += args.sbatch_arg
    env = jax_env('"$COORDINATOR"', "$SLURM_NTASKS", "$SLURM_PROCID")
    exports = "\n".join(f'export {k}={v}' for k, v in env.items() if k != "JAX_PROCESS_ID")
    command = " ".join(shlex.quote(c) for c in args.command)
    lines = ["#!/usr/bin/env bash"] + [f"#SBATCH {d}" for d in directives] + [
        "# Written by launch/slurm.py: one task per node; each task's JAX process owns all of its node's GPUs.",
        "set -euo pipefail",
        f"cd {shlex.quote(args.repo_dir)}",
        f"mkdir -p {shlex.quote(args.log_dir)}",
        f"source {shlex.quote(args.venv)}/bin/activate",
        # (sed, not head: head would close the pipe early, and pipefail would end the job on scontrol's SIGPIPE)
        'COORDINATOR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p):' + str(args.port) + '"',
        exports,
        'echo "[slurm] job $SLURM_JOB_ID: $SLURM_NTASKS processes, coordinator $JAX_COORDINATOR_ADDRESS"',
        # JAX_PROCESS_ID must be each task's own $SLURM_PROCID: expanded inside the task, not here.
        f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c "
        f"{shlex.quote('export JAX_PROCESS_ID=$SLURM_PROCID; exec ' + command)}",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    script = sbatch_script(args)
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    script_dir = args.script_dir or os.path.join(args.repo_dir, args.log_dir)
    os.makedirs(script_dir, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"{args.job_name}-", suffix=".sbatch", dir=script_dir)
    with os.fdopen(fd, "w") as fh:
        fh.write(script)
    proc = subprocess.run(["sbatch", path], capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode == 0:
        print(f"[launch] submitted {path}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
