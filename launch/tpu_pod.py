#!/usr/bin/env python3
"""Run one command on every worker of a Cloud TPU pod slice, joined into one JAX job.

    python launch/tpu_pod.py --tpu my-v5p-64 --zone us-east5-a [--project P] [--repo-dir ~/sweet_jax] \\
        [--dry-run] -- python -m sweet_jax.train --config configs/critic_8b.py --config.mesh.fsdp=-1

What it does:
1. Asks `gcloud compute tpus tpu-vm describe` for the workers' internal IPs (or takes --workers and --coordinator).
2. Starts `gcloud compute tpus tpu-vm ssh --worker=i` for every worker at once. Each runs the command in --repo-dir
   with JAX_COORDINATOR_ADDRESS (worker 0, port --port), JAX_NUM_PROCESSES and its own JAX_PROCESS_ID, which
   `sweet_jax.parallel.distributed.initialize` turns into `jax.distributed.initialize`.
3. Prefixes every output line with its worker, keeps a log per worker under --log-dir, and waits. If one worker
   fails or you press Ctrl-C, it stops the others; the exit status is the first failure's.

`--dry-run` prints the commands instead of running them (no gcloud call is made; give --workers, and the coordinator
IP if you know it). The repository must already be on every worker (e.g. `gcloud ... scp --worker=all`, or a shared
disk), and `bash launch/setup.sh` run there once.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sweet_jax.parallel.distributed import env as jax_env  # noqa: E402  (stdlib-only import: no jax needed here)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tpu", required=True, help="TPU VM (pod slice) name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default=None)
    p.add_argument("--workers", type=int, default=None, help="number of hosts (default: from gcloud describe)")
    p.add_argument("--coordinator", default=None, help="worker 0's internal IP (default: from gcloud describe)")
    p.add_argument("--port", type=int, default=8476, help="coordinator port on worker 0")
    p.add_argument("--repo-dir", default="~/sweet_jax", help="the repository's path on the workers")
    p.add_argument("--log-dir", default="logs/tpu_pod", help="per-worker logs, on this machine")
    p.add_argument("--gcloud", default="gcloud", help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every worker runs")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("give the command after --, e.g. -- python -m sweet_jax.train --config configs/critic_8b.py")
    return args


def _gcloud(args, *cmd: str) -> list[str]:
    out = [args.gcloud, "compute", "tpus", "tpu-vm", *cmd, args.tpu, "--zone", args.zone]
    return out + (["--project", args.project] if args.project else [])


def worker_ips(args) -> list[str]:
    proc = subprocess.run(_gcloud(args, "describe") + ["--format", "json"], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"error: gcloud describe {args.tpu} failed: {proc.stderr.strip()}")
    endpoints = json.loads(proc.stdout).get("networkEndpoints", [])
    ips = [e.get("ipAddress") for e in endpoints]
    if not ips or not all(ips):
        raise SystemExit(f"error: gcloud describe {args.tpu} listed no worker IPs (networkEndpoints)")
    return ips


def worker_commands(args, workers: int, coordinator: str) -> list[list[str]]:
    """The ssh command for each worker."""
    out = []
    for i in range(workers):
        env = jax_env(f"{coordinator}:{args.port}", workers, i)
        remote = (f"cd {args.repo_dir} && " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
                  + " ".join(shlex.quote(c) for c in args.command))
        out.append(_gcloud(args, "ssh") + [f"--worker={i}", "--command", remote])
    return out


def _pump(stream, prefix: str, log_path: str) -> None:
    with open(log_path, "a") as log:
        for line in stream:
            log.write(line)
            log.flush()
            sys.stdout.write(f"{prefix}{line}")
            sys.stdout.flush()


def run(commands: list[list[str]], log_dir: str) -> int:
    os.makedirs(log_dir, exist_ok=True)
    procs, threads = [], []
    for i, cmd in enumerate(commands):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        t = threading.Thread(target=_pump, args=(p.stdout, f"[worker {i}] ", os.path.join(log_dir, f"worker-{i}.log")),
                             daemon=True)
        t.start()
        procs.append(p)
        threads.append(t)
    status = 0
    try:
        pending = list(procs)
        while pending:
            for p in list(pending):
                try:
                    rc = p.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    continue
                pending.remove(p)
                if rc and not status:
                    status = rc
                    print(f"[launch] worker {procs.index(p)} exited with {rc}; stopping the others", file=sys.stderr)
                    for q in pending:
                        q.terminate()
    except KeyboardInterrupt:
        status = 130
        for p in procs:
            p.terminate()
    for t in threads:
        t.join(timeout=5)
    return status


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        workers = args.workers
        if workers is None:
            raise SystemExit("error: --dry-run makes no gcloud call: give --workers (and --coordinator if known)")
        coordinator = args.coordinator or "WORKER0_IP"
        if not args.coordinator:
            print("# worker 0's IP: " + " ".join(shlex.quote(c) for c in _gcloud(args, "describe"))
                  + " --format 'value(networkEndpoints[0].ipAddress)'")
    else:
        ips = None if (args.workers and args.coordinator) else worker_ips(args)
        workers = args.workers or len(ips)
        coordinator = args.coordinator or ips[0]
    commands = worker_commands(args, workers, coordinator)
    if args.dry_run:
        for cmd in commands:
            print(" ".join(shlex.quote(c) for c in cmd))
        return 0
    print(f"[launch] {workers} workers of {args.tpu}, coordinator {coordinator}:{args.port}", file=sys.stderr)
    return run(commands, args.log_dir)


if __name__ == "__main__":
    sys.exit(main())
