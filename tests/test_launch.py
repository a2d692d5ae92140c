"""The launchers in launch/: their dry runs, and real local runs through stand-ins for gcloud and srun that start
the processes on this machine, which then join one JAX job."""

import os
import socket
import stat
import subprocess
import sys
import textwrap

import budget
import pytest
from multidevice import device_flags, one_job_at_a_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOIN = ("from sweet_jax.parallel import distributed; distributed.initialize(); import jax, os; "
        "os.write(1, b'JOINED %d %d %d\\n' % (jax.process_index(), jax.process_count(), jax.device_count()))")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shim(directory, name, body):
    path = os.path.join(directory, name)
    with open(path, "w") as fh:
        fh.write("#!/usr/bin/env bash\n" + textwrap.dedent(body))
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def _env(tmp_path, **extra):
    return dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}", JAX_PLATFORMS="cpu",
                XLA_FLAGS=device_flags(2), **extra)


def _launch(script, *args, env=None, timeout=None):
    with one_job_at_a_time():
        return subprocess.run([sys.executable, os.path.join(ROOT, "launch", script), *args], capture_output=True,
                              text=True, timeout=timeout or budget.time_left(), env=env, cwd=ROOT)


# ------------------------------------------------------------------------------------------------ TPU pod slice
def _fake_gcloud(tmp_path):
    # describe: two workers on this machine; ssh --worker=i --command C: run C here.
    return _shim(tmp_path, "gcloud", """
        if [ "$4" = describe ]; then
            echo '{"networkEndpoints": [{"ipAddress": "127.0.0.1"}, {"ipAddress": "127.0.0.1"}]}'; exit 0
        fi
        while [ $# -gt 0 ]; do [ "$1" = --command ] && exec bash -c "$2"; shift; done
        exit 99
    """)


def test_tpu_pod_dry_run_prints_one_ssh_per_worker():
    proc = _launch("tpu_pod.py", "--tpu", "pod", "--zone", "us-east5-a", "--workers", "4", "--dry-run", "--",
                   "python", "-m", "sweet_jax.train", "--config", "configs/critic_8b.py", "--config.data.path=a b.jsonl")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(lines) == 4
    for i, line in enumerate(lines):
        assert line.startswith(f"gcloud compute tpus tpu-vm ssh pod --zone us-east5-a --worker={i} --command ")
        assert f"JAX_PROCESS_ID={i} " in line and "JAX_NUM_PROCESSES=4" in line
        assert "JAX_COORDINATOR_ADDRESS=WORKER0_IP:8476" in line and "'--config.data.path=a b.jsonl'" in line
    assert "describe pod --zone us-east5-a" in proc.stdout  # how to find the IP


def test_tpu_pod_launch_joins_every_worker_into_one_job(tmp_path):
    gcloud = _fake_gcloud(tmp_path)
    proc = _launch("tpu_pod.py", "--tpu", "pod", "--zone", "z", "--gcloud", gcloud, "--repo-dir", ROOT,
                   "--port", str(_port()), "--log-dir", str(tmp_path / "logs"), "--", sys.executable, "-c", JOIN,
                   env=_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[worker 0] JOINED 0 2 4" in proc.stdout and "[worker 1] JOINED 1 2 4" in proc.stdout
    assert "JOINED 1 2 4" in (tmp_path / "logs" / "worker-1.log").read_text()


def test_tpu_pod_stops_everything_when_a_worker_fails(tmp_path):
    gcloud = _fake_gcloud(tmp_path)
    code = "import os, sys, time; sys.exit(3) if os.environ['JAX_PROCESS_ID'] == '1' else time.sleep(120)"
    proc = _launch("tpu_pod.py", "--tpu", "pod", "--zone", "z", "--gcloud", gcloud, "--repo-dir", ROOT,
                   "--log-dir", str(tmp_path / "logs"), "--", sys.executable, "-c", code, env=_env(tmp_path),
                   timeout=60)
    assert proc.returncode == 3 and "worker 1 exited with 3; stopping the others" in proc.stderr


# ------------------------------------------------------------------------------------------------ SLURM
def test_slurm_dry_run_prints_a_valid_sbatch_script(tmp_path):
    proc = _launch("slurm.py", "--nodes", "4", "--gpus-per-node", "8", "--partition", "gpu", "--time", "24:00:00",
                   "--dry-run", "--", "python", "-m", "sweet_jax.train", "--config", "configs/critic_8b.py")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=24:00:00", "#SBATCH --requeue",
                 "export JAX_NUM_PROCESSES=$SLURM_NTASKS"):
        assert line in script.splitlines(), line
    assert "exec python -m sweet_jax.train --config configs/critic_8b.py" in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_slurm_job_joins_every_task_into_one_job(tmp_path):
    # scontrol: the allocation's first node is this machine; srun: start $SLURM_NTASKS tasks here.
    _shim(tmp_path, "scontrol", "echo 127.0.0.1; echo node-2\n")
    _shim(tmp_path, "srun", """
        while [ "${1#--}" != "$1" ]; do shift; done
        for i in $(seq 0 $((SLURM_NTASKS - 1))); do SLURM_PROCID=$i "$@" & done
        wait
    """)
    proc = _launch("slurm.py", "--nodes", "2", "--gpus-per-node", "2", "--repo-dir", ROOT,
                   "--venv", os.path.dirname(os.path.dirname(sys.executable)), "--port", str(_port()),
                   "--log-dir", str(tmp_path / "logs"), "--dry-run", "--", sys.executable, "-c", JOIN)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(proc.stdout)
    with one_job_at_a_time():
        job = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=budget.time_left(),
                             env=_env(tmp_path, SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node-[1-2]", SLURM_NTASKS="2"))
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    joined = sorted(line for line in job.stdout.splitlines() if line.startswith("JOINED"))
    assert joined == ["JOINED 0 2 4", "JOINED 1 2 4"], job.stdout


def test_the_accelerator_extras_are_jaxs_own_at_the_pinned_jax():
    """`pip install -e .[cuda12]` / `.[cuda13]` / `.[tpu]` (what `launch/setup.sh --accelerator` installs) ask jax
    itself, at the pinned version, for its CUDA 12 or CUDA 13 plugin or its libtpu, so the plugin always matches the
    pinned jaxlib. The extras must exist in that jax's own metadata, and pin the plugin and jaxlib to that version;
    the project's requires-python is the pinned jax's."""
    import importlib.metadata
    import re
    import tomllib

    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    pins = dict(re.fullmatch(r"([\w.-]+)==(\S+)", d).groups() for d in project["dependencies"] if "==" in d)
    version = pins["jax"]
    assert pins["jaxlib"] == version == importlib.metadata.version("jax")
    extras = project["optional-dependencies"]
    assert "cuda" not in extras  # which CUDA is the user's choice
    for extra in ("cuda12", "cuda13", "tpu"):
        assert extras[extra] == [f"jax[{extra}]=={version}"], extras[extra]
    declared = importlib.metadata.requires("jax")
    for extra, plugin in (("cuda12", "jax-cuda12-plugin"), ("cuda13", "jax-cuda13-plugin"), ("tpu", "libtpu")):
        wanted = [r for r in declared if r.endswith(f'extra == "{extra}"')]
        assert any(r.startswith(f"jaxlib<={version},>={version}") for r in wanted), wanted
        assert any(r.startswith(plugin) for r in wanted), wanted
    for cuda in ("12", "13"):
        assert any(r.startswith(f"jax-cuda{cuda}-plugin[with-cuda]<={version},>={version}") for r in declared)
    assert project["requires-python"] == importlib.metadata.metadata("jax")["Requires-Python"]


def test_setup_refuses_an_unknown_accelerator_before_installing_anything(tmp_path):
    env = dict(os.environ, SWEET_JAX_VENV=str(tmp_path / "venv"))
    for args, message in ((["--accelerator", "gpu"], "--accelerator 'gpu': expected cpu, cuda12, cuda13 or tpu"),
                          (["--accelerator", "cuda"], "say which CUDA, cuda12 (driver >= 525) or cuda13"),
                          (["--cuda"], "unknown argument '--cuda'")):
        proc = subprocess.run(["bash", os.path.join(ROOT, "launch", "setup.sh"), *args], capture_output=True,
                              text=True, env=env, timeout=budget.time_left())
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()


_LDCONFIG = """
    echo "2 libs found in cache \\`/etc/ld.so.cache'"
    echo "	libtcmalloc_minimal.so.4 (libc6,x86-64) => /opt/gperftools/libtcmalloc_minimal.so.4"
    echo "	libc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6"
"""


def _launcher_env(tmp_path, ldconfig=_LDCONFIG, **env) -> dict[str, str]:
    """LD_PRELOAD and GLIBC_TUNABLES after sourcing launch/env.sh in an environment with `env` set, and on the PATH an
    `ldconfig` that runs the script `ldconfig` (by default, one that lists tcmalloc at a made-up path)."""
    _shim(tmp_path, "ldconfig", ldconfig)
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES", "SWEET_JAX_TCMALLOC")}
    base.update(env, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", "-c", 'source launch/env.sh && printf "%s\\n%s" "${LD_PRELOAD-unset}" '
                                         '"${GLIBC_TUNABLES-unset}"'], cwd=ROOT, env=base, capture_output=True,
                          text=True, check=True)
    preload, tunables = done.stdout.split("\n")
    return {"LD_PRELOAD": preload, "GLIBC_TUNABLES": tunables}


def test_the_launchers_preload_tcmalloc_and_keep_a_users_settings(tmp_path):
    lib, hugetlb = "/opt/gperftools/libtcmalloc_minimal.so.4", "glibc.malloc.hugetlb=1"
    assert _launcher_env(tmp_path) == {"LD_PRELOAD": lib, "GLIBC_TUNABLES": hugetlb}
    assert _launcher_env(tmp_path, LD_PRELOAD="/x/libfoo.so", GLIBC_TUNABLES="glibc.malloc.arena_max=2") == {
        "LD_PRELOAD": f"/x/libfoo.so:{lib}", "GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{hugetlb}"}
    # the user's own allocator, or their choice of huge pages, stands; SWEET_JAX_TCMALLOC=0 preloads nothing
    assert _launcher_env(tmp_path, LD_PRELOAD="/x/libjemalloc.so.2")["LD_PRELOAD"] == "/x/libjemalloc.so.2"
    off = "glibc.malloc.hugetlb=0"
    assert _launcher_env(tmp_path, GLIBC_TUNABLES=off)["GLIBC_TUNABLES"] == off
    assert _launcher_env(tmp_path, SWEET_JAX_TCMALLOC="0")["LD_PRELOAD"] == "unset"
    no_tcmalloc = "\n".join(line for line in _LDCONFIG.splitlines() if "tcmalloc" not in line)
    assert _launcher_env(tmp_path, no_tcmalloc) == {"LD_PRELOAD": "unset", "GLIBC_TUNABLES": hugetlb}


# Allocates a fresh 256 MiB buffer eight times over, as XLA:CPU's steps allocate their temporaries (malloc, one write
# per 4 KiB page, free), and prints the minor page faults that took.
_FAULTS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 256 << 20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_under_the_launchers_environment_a_steps_buffers_are_not_faulted_in_afresh():
    """The environment launch/env.sh gives this machine: tcmalloc reuses a freed buffer, or glibc maps it in huge
    pages; either way half the page faults or fewer (tcmalloc gives back some of what it holds now and then)."""
    launched = subprocess.run(["bash", "-c", "source launch/env.sh && env -0"], cwd=ROOT, capture_output=True,
                              check=True).stdout.decode()
    env = dict(line.split("=", 1) for line in launched.split("\0") if "=" in line)
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            thp = "[madvise]" in fh.read()
    except OSError:
        thp = False
    if "tcmalloc" not in env.get("LD_PRELOAD", "") and not thp:
        pytest.skip("neither tcmalloc (launch/setup.sh installs it with apt) nor THP in madvise mode here")
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}

    def faults(env):
        return int(subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True,
                                  check=True).stdout)

    before, after = faults(plain), faults(env)
    assert before >= 8 * 60_000  # glibc maps each buffer afresh: a fault per 4 KiB page, every time
    assert after * 2 <= before, (before, after)
