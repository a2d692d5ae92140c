"""Models named by Hub id (`files/hub.py`), offline, from a local cache laid out as the Hub lays it out (blobs named
by their hash, snapshots of symlinks per commit, refs naming commits): the id, a tag and a pinned commit resolve to
their snapshots; a missing id, revision or file is named; `train`, `serve` and the pipeline run from an id with no
network, and train exactly as from the same model's directory."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request

import budget
import jax
import numpy as np
import pytest
import safetensors.numpy
from huggingface_hub import constants
from system import start_server

from sweet_jax import chat, models
from sweet_jax.colbench import synthetic
from sweet_jax.colbench.task_sets import load_tasks
from sweet_jax.data.trajectories import read_trajectories
from sweet_jax.files.hub import HubError, display_name, hub_id, local_model
from sweet_jax.runs.run_layout import RunLayout
from sweet_jax.training.defaults import TINY_MODEL, TINY_TOKENIZER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = "tiny-org/tiny-llama"
DATA = "tiny-org/colbench-mini"  # a Hub dataset: test_tasks.jsonl and trajectories.jsonl
MAIN = "1" * 40  # the commit `main` names
V2 = "2" * 40  # the commit the tag `v2` names: one layer instead of two


def lay_out(cache: str, repo: str, files_from: str, commit: str, refs=("main",), kind: str = "models") -> str:
    """`files_from`'s files as the Hub cache holds `repo` (of `kind`: models, datasets) at `commit`: each file a
    blob named by its hash, the snapshot's entries relative symlinks to them, and `refs/NAME` holding the commit.
    Returns the snapshot."""
    root = os.path.join(cache, f"{kind}--" + repo.replace("/", "--"))
    snapshot = os.path.join(root, "snapshots", commit)
    os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    for name in os.listdir(files_from):
        data = open(os.path.join(files_from, name), "rb").read()
        blob = hashlib.sha256(data).hexdigest()
        with open(os.path.join(root, "blobs", blob), "wb") as fh:
            fh.write(data)
        os.makedirs(snapshot, exist_ok=True)
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snapshot, name))
    for ref in refs:
        with open(os.path.join(root, "refs", ref), "w") as fh:
            fh.write(commit)
    return snapshot


def _tiny_model(path: str, num_layers: int) -> None:
    cfg = models.LlamaConfig.preset("tiny", **{**TINY_MODEL, "num_layers": num_layers})
    models.save_hf_params(models.init_params(cfg, jax.random.key(0), std=0.1), cfg, path)
    src = chat.tokenizer_dir(TINY_TOKENIZER)
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), path)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """{cache, model (the same model's plain directory), main, v2 (snapshots)}: REPO at `main` (two layers) and at
    the tag `v2` (one layer), and `tiny-org/broken`, a snapshot with no config.json."""
    root = tmp_path_factory.mktemp("hub")
    cache = str(root / "cache")
    _tiny_model(str(root / "model"), 2)
    _tiny_model(str(root / "model_v2"), 1)
    os.makedirs(root / "broken")
    (root / "broken" / "tokenizer.json").write_text("{}")
    os.makedirs(root / "data")
    synthetic.write_dataset(root / "data" / "trajectories.jsonl", num_tasks=4, rollouts=2, seed=0)
    tasks = [json.loads(line)["task"] for line in open(root / "data" / "trajectories.jsonl")][:4]
    with open(root / "data" / "test_tasks.jsonl", "w") as fh:
        fh.writelines(json.dumps(t) + "\n" for t in tasks)
    lay_out(cache, DATA, str(root / "data"), MAIN, refs=("main", "v1"), kind="datasets")
    return {"cache": cache, "model": str(root / "model"), "main": lay_out(cache, REPO, str(root / "model"), MAIN),
            "data": str(root / "data"),
            "v2": lay_out(cache, REPO, str(root / "model_v2"), V2, refs=("v2",)),
            "broken": lay_out(cache, "tiny-org/broken", str(root / "broken"), MAIN)}


@pytest.fixture
def offline_cache(hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", hub["cache"])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def _env(hub) -> dict:
    return {**os.environ, "HF_HUB_CACHE": hub["cache"], "HF_HUB_OFFLINE": "1"}


def test_an_id_a_tag_and_a_pinned_commit_resolve_offline_to_their_snapshots(offline_cache):
    hub = offline_cache
    assert local_model(REPO) == hub["main"]
    assert local_model(f"{REPO}@v2") == hub["v2"]
    assert local_model(f"{REPO}@{MAIN}") == hub["main"]
    assert local_model(hub["model"]) == hub["model"]  # a directory stays itself
    assert hub_id(hub["model"]) is None and hub_id(f"{REPO}@v2") == (REPO, "v2")
    assert display_name(REPO) == display_name(hub["main"]) == "tiny-llama"
    assert display_name(hub["model"]) == "model"
    # the tag's snapshot is the one-layer model; main's the two-layer one
    assert models.load_model(f"{REPO}@v2").cfg.num_layers == 1
    by_id, by_dir = models.load_model(REPO), models.load_model(hub["model"])
    assert by_id.cfg.num_layers == 2
    for a, b in zip(jax.tree.leaves(by_id.params), jax.tree.leaves(by_dir.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_task_sets_and_trajectories_read_a_file_of_a_hub_dataset_offline(offline_cache):
    hub = offline_cache
    local = load_tasks(os.path.join(hub["data"], "test_tasks.jsonl"), "backend")
    assert load_tasks(f"{DATA}:test_tasks.jsonl", "backend") == local
    assert load_tasks(f"{DATA}@v1:test_tasks.jsonl", "backend", limit=2) == local[:2]
    assert len(local) == 4
    by_id = [t.answer for t in read_trajectories(f"{DATA}@{MAIN}:trajectories.jsonl")]
    assert by_id == [t.answer for t in read_trajectories(os.path.join(hub["data"], "trajectories.jsonl"))]
    assert len(by_id) == 8
    with pytest.raises(HubError, match=r"tiny-org/colbench-mini@v9:absent.jsonl: not a local file, and the hub could "
                                       r"not provide it: 'absent.jsonl' of the Hub dataset 'tiny-org/colbench-mini' "
                                       r"\(revision v9\) is not in the Hub cache"):
        load_tasks(f"{DATA}@v9:absent.jsonl", "backend")


@pytest.mark.parametrize("name, said", [
    ("tiny-org/absent", ["'tiny-org/absent' (revision main)", "not in the Hub cache", "HF_HUB_OFFLINE=1",
                         "huggingface-cli download tiny-org/absent"]),
    (f"{REPO}@v3", [f"'{REPO}' (revision v3)", "not in the Hub cache", "--revision v3"]),
    ("tiny-org/broken", ["'tiny-org/broken' (revision main)", "has no config.json"]),
])
def test_a_missing_id_revision_or_file_is_named(offline_cache, name, said):
    with pytest.raises(HubError) as e:
        local_model(name)
    for words in said:
        assert words in str(e.value), str(e.value)
    if "not in the Hub cache" in said:
        assert offline_cache["cache"] in str(e.value)


@pytest.mark.slow
def test_train_from_an_id_offline_equals_training_from_its_directory(hub, tmp_path):
    small = ["--config.data.synthetic.num_tasks=24", "--config.data.eval_fraction=0.25", "--config.train.epochs=1",
             "--config.optim.batch_size=4", "--config.optim.micro_batch_size=4", "--config.train.eval_every=0",
             "--config.train.export_dtype=float32"]
    runs = {}
    for how, model in (("id", REPO), ("directory", hub["model"])):
        out = tmp_path / how
        cmd = [sys.executable, "-m", "sweet_jax.train", "--config", os.path.join(ROOT, "configs", "critic_tiny.py"),
               f"--config.train.output_dir={out}", f"--config.model.hf_path={model}", *small]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env(hub),
                              timeout=budget.time_left())
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[how] = safetensors.numpy.load_file(str(out / "hf" / "model.safetensors"))
    assert json.loads((tmp_path / "id" / "config.json").read_text())["model"]["hf_path"] == REPO  # the id kept
    assert sorted(runs["id"]) == sorted(runs["directory"])
    for name in runs["id"]:
        np.testing.assert_array_equal(runs["id"][name], runs["directory"][name], err_msg=name)


@pytest.mark.slow
def test_serve_a_pinned_id_offline(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", hub["cache"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    proc, url = start_server(f"{REPO}@v2", tmp_path, "--max-model-len", "256")
    try:
        served = json.load(urllib.request.urlopen(url + "/v1/models", timeout=30))
        assert [m["id"] for m in served["data"]] == ["tiny-llama"]
        body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(req, timeout=120))
        assert reply["usage"]["completion_tokens"] == 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_pipeline_with_a_missing_id_stops_before_any_stage(hub, tmp_path):
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", "configs/sweet_backend_tiny.py",
           f"--config.run_dir={tmp_path / 'run'}", "--config.policy_init=tiny-org/absent"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env(hub), timeout=budget.time_left())
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "policy_init 'tiny-org/absent' (revision main): not a local directory" in proc.stderr
    assert not (tmp_path / "run" / "stages").exists()


@pytest.mark.slow
def test_a_pipeline_serves_and_collects_with_a_policy_named_by_id_offline(hub, tmp_path):
    run = tmp_path / "run"
    # the testbed's first stages: its tasks, then the policy (served by `sweet_jax.serve` from the Hub cache)
    # against the scripted human on 4 tasks
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", "configs/sweet_testbed_tiny.py",
           f"--config.run_dir={run}", "--config.base.config=", f"--config.policy_init={REPO}",
           "--config.tasks.num_train=4", "--config.tasks.num_test=4", "--config.data.rollouts=1",
           "--stage", "tasks,data"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env(hub), timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(RunLayout(str(run)).trajectories)]
    assert len(rows) == 4
    serve_log = open(run / "logs" / "data.serve.log").read()
    assert f"--model={hub['main']}" in serve_log and "--served_model_name=tiny-llama" in serve_log
