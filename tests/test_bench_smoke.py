"""The benchmark scripts run end to end on a small shape (no timing is asserted: speed lives in bench/)."""

import json
import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

import budget
from system import COLBENCH, needs_bwrap, needs_renderer
from test_vllm import needs_vllm


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_forward_benchmark_runs_and_agrees_with_hf():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "forward.py"), "--batch", "1", "--seq", "64", "--repeats", "1",
         "--rounds", "1"], capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"ratio sweet_jax / HF: ([\d.]+)x\s+\(max \|log-prob diff\| ([\d.e+-]+)", proc.stdout)
    assert m, proc.stdout
    assert float(m.group(1)) > 0 and float(m.group(2)) < 1e-4
    assert re.search(r"sweet_jax: .* of peak\)", proc.stdout)


@pytest.mark.slow
def test_logprob_memory_benchmark_runs():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "logprob_memory.py"), "--seq", "1024", "--peer-seq", "256"],
        capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"sweet_jax: T=1024, V=128256: peak RSS [\d.]+ GiB .* PASS", proc.stdout), proc.stdout
    assert "HF uses" in proc.stdout


@pytest.mark.slow
def test_dpo_step_benchmark_runs():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "dpo_step.py"), "--steps", "3", "--hidden", "64", "--layers",
         "1", "--pairs", "2", "--tokenizer", "bundled:llama3-8k"],
        capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"ratio sweet_jax / TRL: [\d.]+x faster", proc.stdout), proc.stdout


@pytest.mark.slow
def test_dpo_prefix_benchmark_runs_and_packed_equals_plain():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "dpo_prefix.py"), "--history", "48", "--turn", "12", "--hidden",
         "64", "--layers", "1", "--vocab", "1000", "--pairs", "2", "--steps", "2"],
        capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"packed vs plain losses over 2 steps: max \|diff\| ([\d.e+-]+)", proc.stdout)
    assert m and float(m.group(1)) <= 1e-5, proc.stdout
    assert re.search(r"speed-up packed vs own plain path: [\d.]+x", proc.stdout), proc.stdout
    assert re.search(r"ratio sweet_jax \(packed\) / TRL: [\d.]+x faster", proc.stdout), proc.stdout
    assert re.search(r"sweet_jax packed .* XLA temp \d+ MiB/pair, peak RSS [\d.]+ GiB/pair", proc.stdout), proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(COLBENCH, "backend_test.jsonl")),
                    reason="ColBench test set not at ../shared/colbench")
@needs_bwrap
def test_backend_eval_benchmark_runs():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "backend_eval.py"), "--tasks", "20"],
                          capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"ratio sandboxed / in-process: [\d.]+x", proc.stdout), proc.stdout
    assert "records whose reward differs: []" in proc.stdout, proc.stdout


def test_mfu_benchmark_runs_and_counts_the_model_flops(tmp_path):
    out = tmp_path / "mfu.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "mfu.py"), "--layers", "1", "--hidden", "64", "--seq", "256",
         "--steps", "2", "--warmup", "1", "--peak-tflops", "1", "--dtype", "float32", "--json", str(out)],
        capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"MFU: [\d.]+% of 1 TFLOP/s peak", proc.stdout), proc.stdout
    r = json.loads(out.read_text())
    assert r["sequences"] == 2 and r["seq"] == 256
    # by hand, per token: 6 x (q 64x64 + k, v 64x32 + o 64x64 + MLP 3 x 64x256 + LM head 64x128256 = 8,269,824
    # weights) + 3 x causal attention (2 x 2 x 4 heads x 16 x 256/2 = 32,768) = 49,717,248; two 256-token rows
    assert abs(r["model_tflops_per_step"] * 1e12 - 49_717_248 * 2 * 256) < 1e3
    assert abs(r["mfu"] - r["model_tflops_per_step"] / r["step_s"] / 1.0) < 1e-9


@needs_renderer
@pytest.mark.skipif(not os.path.exists(os.path.join(COLBENCH, "frontend_test.jsonl")),
                    reason="ColBench test set not at ../shared/colbench")
def test_render_benchmark_runs():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "render.py"), "--pages", "3",
                           "--baseline-pages", "1"], capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"pages: 3 real ColBench targets, 0 failed", proc.stdout), proc.stdout
    assert re.search(r"ratio baseline / ours: [\d.]+x", proc.stdout)


@pytest.mark.slow
def test_prefix_scoring_and_decode_benchmarks_run():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "prefix_scoring.py"), "--history", "256",
                           "--cand", "32", "--num", "4", "--hidden", "64", "--layers", "1", "--vocab", "1000",
                           "--repeats", "1"], capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert re.search(r"speed-up shared / independent: [\d.]+x", proc.stdout), proc.stdout
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "decode.py"), "--hidden", "64", "--layers",
                           "1", "--vocab", "1000", "--batch", "2", "--prompt", "16", "--new", "8", "--repeats", "1"],
                          capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"greedy tokens agreeing: (\d+)/(\d+)", proc.stdout)
    assert m and int(m.group(1)) == int(m.group(2)) == 16, proc.stdout  # the same model, the same greedy tokens


@pytest.mark.slow
def test_decode_mbu_benchmark_runs():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "decode_mbu.py"), "--models", "tiny", "--batches", "1,2",
         "--prompt", "16", "--steps", "4", "--dtype", "float32", "--peak-gbs", "20"],
        capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(re.findall(r"tokens/s .* GB/s .*% MBU", proc.stdout)) == 2, proc.stdout


@pytest.mark.slow
@needs_vllm
def test_serve_load_benchmark_runs_against_vllm():
    """Against the test run's shared vLLM server (`test_vllm.shared_vllm`), so this test starts no vLLM of its own."""
    from test_vllm import shared_vllm

    url, model = shared_vllm()
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "serve_load.py"), "--model", model, "--conversations", "2",
         "--turns", "2", "--min-new", "4", "--max-new", "8", "--max-model-len", "1024", "--vllm-url", url,
         "--vllm-model", "hf"], capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"vLLM .* tokens/s .*already running", proc.stdout), proc.stdout
    assert re.search(r"ratio: [\d.]+x vLLM's tokens/s, p50 [\d.]+x vLLM's", proc.stdout), proc.stdout


@pytest.mark.slow
def test_gpu_suite_smoke_runs_every_row(tmp_path):
    """Every row of the accelerator suite at tiny shapes: the versions first, each attention layout and the jobs'
    pair rows equal the reference within their tolerance, the compiled decode step copies no cache, and the summary
    lists every target figure."""
    out = tmp_path / "suite.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_suite.py"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    failed = {name: row["error"] for name, row in rows.items() if not row["ok"]}
    assert not failed and len(rows) == 25, (failed, sorted(rows))
    assert proc.stdout.index("versions: device cpu") < proc.stdout.index("attention fwd+bwd")
    assert rows["versions"]["jax"] == jax.__version__ and rows["versions"]["commit"]
    paths = {name: row["path"] for name, row in rows.items() if name.startswith("attention") and "path" in row}
    assert sorted(paths.values()) == ["one segment", "packed: mask", "whole rows"], paths  # no packed kernel on CPU
    checked = [name for name, row in rows.items() if "max_abs_diff_vs_reference" in row]
    assert len(checked) == 8, checked  # the attention layouts, the masked row, the pair rows both ways
    for name in checked:
        assert rows[name]["max_abs_diff_vs_reference"] <= 1e-5 and rows[name]["tolerance"] == 1e-4, rows[name]
    assert rows["8B decode step: whole-cache copies in the compiled program"]["whole_cache_copies"] == 0
    assert rows["split 1B 2x4096"]["forward_ms"] > 0 and rows["split 1B 2x4096"]["backward_ms"] > 0
    for figure in ("critic 1B 2x4096 MFU", "backward / forward (1B)", "8B decode batch 64 prompt 2048 MBU",
                   "critic 1B vs HF+torch", "1B decode batch 1 vs HF generate"):
        assert re.search(rf"^{re.escape(figure)}\s+\S+", proc.stdout, re.M), proc.stdout


def test_gpu_suite_fails_a_row_whose_kernel_is_wrong(monkeypatch):
    """A kernel that drops each row's last key (an off-by-one in the lengths it is given): the one-segment row's
    output is further from the reference than its tolerance, and the row fails saying so; the whole-rows row, which
    does not use that kernel, passes."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_suite
    from importlib import import_module

    attention = import_module("sweet_jax.models.attention")
    right = attention.segment_attention_one_segment
    monkeypatch.setattr(attention, "segment_attention_one_segment",
                        lambda q, k, v, lengths, **kw: right(q, k, v, jnp.maximum(lengths - 1, 1), **kw))
    rows = dict(gpu_suite.attention_rows(True))
    bad = gpu_suite.run_row("one segment", rows["attention fwd+bwd one segment + padding (lengths)"])
    assert not bad["ok"] and "differs from the reference" in bad["error"], bad
    good = gpu_suite.run_row("whole rows", rows["attention fwd+bwd whole rows (is_causal)"])
    assert good["ok"] and good["max_abs_diff_vs_reference"] <= 1e-5, good


def test_gpu_suite_section_past_its_limit_loses_only_its_rows():
    """A section stopped at its time limit reports each of its rows as failed, saying why, and returns."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_suite

    t0 = time.monotonic()
    rows = gpu_suite.run_section("critic", smoke=True, limit_s=2)
    assert time.monotonic() - t0 < 30
    assert [r["row"] for r in rows] == [name for name, _ in gpu_suite.critic_rows(True)]
    assert all(not r["ok"] and "2 s limit" in r["error"] for r in rows), rows


@pytest.mark.slow
def test_profile_step_prints_the_groups_and_the_passes():
    """The critic step of a tiny model on CPU: device time by group (attention and log-prob found by the model's
    named scopes), the backward / forward ratio, and the top ops."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "profile_step.py"), "critic", "--preset", "tiny",
                           "--layers", "1", "--hidden", "64", "--seq", "128", "--chunk", "64", "--dtype", "float32",
                           "--steps", "2", "--top", "5"], capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    shares = dict(re.findall(r"^(matmul|attention|log-prob|norm/elementwise|copies|collectives)\s+([\d.]+)\s",
                             proc.stdout, re.M))
    assert len(shares) == 6 and float(shares["attention"]) > 0 and float(shares["log-prob"]) > 0, proc.stdout
    assert re.search(r"backward / forward [\d.]+x", proc.stdout), proc.stdout
    assert len(re.findall(r"^\s+[\d.]+\s+[\d.]+\s+\S", proc.stdout.split("top 5 ops:")[1], re.M)) == 5, proc.stdout
