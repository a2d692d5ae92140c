"""Multi-host runs: joining the other processes of a job, and the few things only one of them should do.

JAX's SPMD runtime is the distributed engine: every process runs the same program on its own devices, and a jitted step
over a mesh that spans all of them is one global computation. What this module adds:

- `initialize()` calls `jax.distributed.initialize` when the job has more than one process, before any device is
  touched. It takes the job's shape from, in order:
    1. `JAX_COORDINATOR_ADDRESS` (host:port of process 0), `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`, as the launchers
       in `launch/` set them (and `torchrun`-style scripts can);
    2. the environment of a Cloud TPU pod slice or a SLURM job step with more than one task, which JAX detects itself.
  A single process (no such environment) is left alone.
- `is_leader()`: process 0, the one that writes run files (config, metrics, caches, the HF export).
- `env(coordinator, num_processes, process_id)`: the variables above, for launchers (this module imports jax and numpy
  only inside its functions, so `launch/` can use it on a machine without jax).
- `from_leader(x)`: process 0's value of `x` on every process, so that all of them take the same branch (a cache that
  only process 0 can see, for instance) and run the same collective computations.
- `ProcessShare`: a job of independent items split over the processes (sampling, ranking, best-of-N evaluation),
  each writing its own partial file, and process 0 merging them once all are written.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("sweet_jax.parallel.distributed")

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def env(coordinator: str, num_processes: int, process_id: int | str) -> dict[str, str]:
    """What a launcher sets for one process (process_id may be a shell expression such as "$SLURM_PROCID")."""
    return {ENV_COORDINATOR: coordinator, ENV_NUM_PROCESSES: str(num_processes), ENV_PROCESS_ID: str(process_id)}


class DistributedError(RuntimeError):
    """An inconsistent multi-host environment; the message names the variables."""


def _explicit_env() -> tuple[str, int, int] | None:
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
    present = [n for n in names if os.environ.get(n)]
    if not present:
        return None
    if len(present) != len(names):
        missing = [n for n in names if n not in present]
        raise DistributedError(f"multi-host run: {', '.join(present)} set but {', '.join(missing)} missing; set all "
                               f"three (launch/ does) or none")
    try:
        num, pid = int(os.environ[ENV_NUM_PROCESSES]), int(os.environ[ENV_PROCESS_ID])
    except ValueError:
        raise DistributedError(f"{ENV_NUM_PROCESSES}={os.environ[ENV_NUM_PROCESSES]!r} and "
                               f"{ENV_PROCESS_ID}={os.environ[ENV_PROCESS_ID]!r} must be integers") from None
    if not 0 <= pid < num:
        raise DistributedError(f"{ENV_PROCESS_ID}={pid} is outside 0..{ENV_NUM_PROCESSES}-1 = 0..{num - 1}")
    return os.environ[ENV_COORDINATOR], num, pid


def _detected_multihost() -> bool:
    """A Cloud TPU pod slice with more than one worker, or a SLURM job step with more than one task."""
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if len(hosts) > 1:
        return True
    return int(os.environ.get("SLURM_STEP_NUM_TASKS", os.environ.get("SLURM_NTASKS", "1")) or 1) > 1


def initialize() -> bool:
    """Join the job's other processes if there are any. Returns True when the run is multi-process."""
    import jax

    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    explicit = _explicit_env()
    if explicit is not None:
        address, num, pid = explicit
        if num == 1:
            return False
        log.info("joining %d processes as process %d (coordinator %s)", num, pid, address)
        jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)
        return True
    if _detected_multihost():
        log.info("joining the processes of this TPU pod slice / SLURM step (detected by jax)")
        jax.distributed.initialize()
        return jax.process_count() > 1
    return False


def is_leader() -> bool:
    import jax

    return jax.process_index() == 0


def from_leader(x):
    """Process 0's value of `x` (a bool, number or numpy array with the same shape on every process)."""
    import jax
    import numpy as np

    if jax.process_count() == 1:
        return x
    from jax.experimental import multihost_utils

    out = multihost_utils.broadcast_one_to_all(np.asarray(x))
    return out.item() if np.ndim(x) == 0 and not isinstance(x, np.ndarray) else np.asarray(out)


def to_host(x):
    """A (possibly multi-host) array as one numpy array on every process. A collective when the array spans
    processes: every process must call it, in the same order."""
    import jax
    import numpy as np

    if getattr(x, "is_fully_addressable", True) or getattr(x, "is_fully_replicated", False):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class ProcessShare:
    """This process's share of a job of independent items, in a `jax.distributed` job (all of them in a single
    process): items i with i % count == index.

        share = ProcessShare()                     # joins the job: call it before jax touches a device
        for i in share.mine(len(items)): ...       # into OUT + share.suffix(".partial")
        share.gather("OUT", merge)                 # every process waits; process 0 alone runs merge()

    `suffix(base)` is base in a single process and base.<index> otherwise, so each process appends to its own file.
    `gather` returns on every process once merge() has run, so the merged output exists when any of them goes on.
    """

    def __init__(self):
        import jax

        initialize()
        self.index, self.count = jax.process_index(), jax.process_count()

    def mine(self, items: int) -> range:
        return range(self.index, items, self.count)

    def suffix(self, base: str, process: int | None = None) -> str:
        return base if self.count == 1 else f"{base}.{self.index if process is None else process}"

    def suffixes(self, base: str) -> list[str]:
        """Every process's `suffix(base)`, in process order."""
        return [self.suffix(base, p) for p in range(self.count)]

    def gather(self, name: str, merge) -> None:
        if self.count == 1:
            merge()
            return
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"{name}: every share written")
        if self.index == 0:
            merge()
        multihost_utils.sync_global_devices(f"{name}: merged")
