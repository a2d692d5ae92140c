"""Kernel paths chosen per device before tracing (`models.kernel_choice`, `parallel.devices`).

On this CPU the device is simulated: an A100 (sm80), an L4 (sm89), an H100 (sm90) and a TPU v5e. The jobs' real
programs (the critic train step, the DPO step on prefix-shared pair rows, the paged decode step) are lowered for
each, and every kernel in them must be one the device runs. Each path's numbers are checked here against the
reference attention: the Pallas kernels in interpret mode, cuDNN through `cudnn_emulator` (a CPU lowering of jax's
own cuDNN primitive, behind jax's own wrapper code), so a wrong offset computed by this jax reads wrong keys here.
"""

from importlib import import_module

import cudnn_emulator
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax.models import kernel_choice
from sweet_jax.parallel import devices

pytestmark = pytest.mark.kernels  # run again on the accelerators' jax (launch/test.sh)

attention = import_module("sweet_jax.models.attention")  # the module (sweet_jax.models.attention is the function)
GPUS = ("a100", "l4", "h100")


# ------------------------------------------------------------------------------------------------- choices
def test_simulated_devices_answer_jax_own_cudnn_checks_and_put_them_back():
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    before = cudnn.check_compute_capability
    with devices.simulate("a100") as d:
        assert devices.current() == d and d.simulated and not d.interpret
        assert not cudnn.check_compute_capability("9.0") and cudnn.check_compute_capability("8.0")
        assert cudnn.check_cudnn_version() == 92800
        with devices.simulate("h100"):
            assert cudnn.check_compute_capability("9.0")
        assert not cudnn.check_compute_capability("9.0")
    assert cudnn.check_compute_capability is before and devices.current().platform == "cpu"


def test_auto_picks_what_each_device_runs():
    bf16, f32 = jnp.bfloat16, jnp.float32
    for name, want in (("a100", "cudnn"), ("l4", "cudnn"), ("h100", "cudnn"), ("v100", "reference"),
                       ("cpu", "reference")):
        assert kernel_choice.attention_impl("auto", bf16, (256, 256), 128, devices.preset(name)) == want, name
    h100, tpu = devices.preset("h100"), devices.preset("tpu-v5e")
    assert kernel_choice.attention_impl("auto", f32, (256, 256), 128, h100) == "reference"  # cuDNN takes bf16/fp16
    assert kernel_choice.attention_impl("auto", bf16, (256, 256), 128, tpu) == "splash"
    assert kernel_choice.attention_impl("auto", bf16, (192, 192), 128, tpu) == "reference"  # not whole tiles
    assert kernel_choice.attention_impl("auto", bf16, (1, 256), 128, tpu) == "reference"  # a decode step
    assert kernel_choice.attention_impl("auto", bf16, (256, 256), 160, devices.preset("a100")) == "reference"
    assert kernel_choice.attention_impl("auto", bf16, (256, 256), 160, h100) == "cudnn"  # Hopper takes 256


@pytest.mark.parametrize("setting,device,dtype,match", [
    ("cudnn", "v100", jnp.bfloat16, "sm80"), ("cudnn", "tpu-v5e", jnp.bfloat16, "NVIDIA GPUs only"),
    ("cudnn", "h100", jnp.float32, "bf16 or fp16"), ("splash", "a100", jnp.bfloat16, "TPU kernel"),
    ("flash", "a100", jnp.bfloat16, "expected one of")])
def test_an_explicit_kernel_the_device_cannot_run_is_a_clear_error(setting, device, dtype, match):
    with pytest.raises(kernel_choice.KernelUnsupported, match=match) as e:
        kernel_choice.attention_impl(setting, dtype, (256, 256), 128, devices.preset(device))
    if setting != "flash":
        assert devices.preset(device).kind in str(e.value)


def test_segment_kernels_per_device():
    """Packed rows: cuDNN's packed layout from Hopper with cuDNN >= 9.6 (the key/value heads repeated before jax
    0.11.1), the Triton flash kernel before; every other layout the Triton kernel; tiles within shared memory."""
    for name in ("a100", "l4"):
        k = kernel_choice.segment_kernels(devices.preset(name), 4096, 128)
        assert (k.packed, k.general, k.repeat_kv) == ("triton", "triton", False) and "Hopper" in k.note
    k = kernel_choice.segment_kernels(devices.preset("h100"), 4096, 128)
    assert (k.packed, k.general) == ("cudnn", "triton")
    assert k.repeat_kv == (devices.jax_version() < (0, 11, 1))
    old_cudnn = kernel_choice.segment_kernels(devices.preset("h100", cudnn_version=90500), 4096, 128)
    assert old_cudnn.packed == "triton" and "9.6.0" in old_cudnn.note
    for name in ("a100", "l4", "h100", "rtx4090"):
        device = devices.preset(name)
        for head_dim in (64, 128):
            b = kernel_choice.triton_blocks(device, 4096, head_dim)
            assert 2 * head_dim * (b.block_q + 2 * b.num_stages * b.block_k) <= device.shared_memory, (name, b)
    assert kernel_choice.triton_blocks(devices.preset("a100"), 24, 64) is None  # no 16-row tile divides 24
    assert kernel_choice.segment_kernels(devices.preset("a100"), 24, 64).general is None


def test_paged_decode_choice_per_device():
    """A 128-token page is one block everywhere; on an L4 (99 KiB) its keys and values fit single-buffered only;
    "on" where no kernel fits is an error naming the device; "off" is off."""
    a100 = kernel_choice.paged_decode("auto", 128, 32, 128, devices.preset("a100"))
    assert (a100.kernel, a100.pages_per_block, a100.num_stages) == ("triton", 1, 2)
    l4 = kernel_choice.paged_decode("auto", 128, 32, 128, devices.preset("l4"))
    assert (l4.kernel, l4.pages_per_block, l4.num_stages) == ("triton", 1, 1)
    small = kernel_choice.paged_decode("auto", 16, 32, 128, devices.preset("h100"))
    assert small.pages_per_block * 16 == kernel_choice.PAGED_BLOCK_TOKENS
    assert kernel_choice.paged_decode("auto", 16, 32, 128, devices.preset("v100")).kernel is None
    with pytest.raises(kernel_choice.KernelUnsupported, match="Tesla V100.*sm80"):
        kernel_choice.paged_decode("on", 16, 32, 128, devices.preset("v100"))
    with pytest.raises(kernel_choice.KernelUnsupported, match="RTX 4090.*do not fit"):
        kernel_choice.paged_decode("on", 256, 32, 128, devices.preset("rtx4090"))
    assert kernel_choice.paged_decode("off", 16, 32, 128, devices.preset("h100")).kernel is None
    assert kernel_choice.paged_decode("auto", 16, 32, 128, devices.preset("tpu-v5e")).kernel == "mosaic"


# ------------------------------------------------------------------------------ paths against the reference
def _qkv(b, t, n, k, h, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=(b, t, x, h)), jnp.bfloat16) for x in (n, k, k))


LAYOUTS = {  # rows of 64 tokens
    "whole rows": lambda b: np.ones((b, 64)),
    "one segment + padding": lambda b: (np.arange(64)[None] < np.array([[50], [64]])[:b]).astype(int),
    "packed": lambda b: np.concatenate([np.full((b, 20), 1), np.full((b, 30), 2), np.zeros((b, 14))], 1),
    "left padding": lambda b: np.concatenate([np.zeros((b, 16)), np.ones((b, 48))], 1),
}


def _check_against_reference(q, k, v, seg, fn, branch=None, tol=(3e-2, 6e-2)):
    """fn(q, k, v, seg, branch)'s values and gradients (of a weighted sum over real tokens) against the reference
    attention in f32. The ids are arguments, so one compiled program serves every layout of a shape."""
    real = (seg > 0)[:, :, None, None]
    w = jnp.asarray(np.random.default_rng(9).normal(size=q.shape), jnp.float32)
    branch = jnp.zeros_like(seg) if branch is None else branch

    def loss(f, q, k, v, seg, branch):
        return jnp.sum(jnp.where((seg > 0)[:, :, None, None], f(q, k, v, seg, branch).astype(jnp.float32), 0) * w)

    def ref_fn(q, k, v, seg, branch):
        return attention.reference_attention(q, k, v, seg, seg, q_branch_ids=branch, kv_branch_ids=branch)

    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    ref = ref_fn(*f32, seg, branch)
    ref_grads = jax.grad(lambda *x: loss(ref_fn, *x), (0, 1, 2))(*f32, seg, branch)
    out = _jitted(fn)(q, k, v, seg, branch)
    grads = _jitted(lambda *x: jax.grad(lambda *y: loss(fn, *y), (0, 1, 2))(*x), ("grad", fn))(q, k, v, seg, branch)
    got = np.asarray(jnp.where(real, out.astype(jnp.float32), 0))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, np.asarray(jnp.where(real, ref, 0)), atol=tol[0])
    for name, a, r in zip("qkv", grads, ref_grads):
        assert np.isfinite(np.asarray(a, np.float32)).all(), name
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(r), atol=tol[1], err_msg=name)


_JITTED = {}


def _jitted(fn, key=None):
    """jax.jit(fn), once per test function (a program per device and shape, not per layout)."""
    key = key or fn
    if key not in _JITTED:
        _JITTED[key] = jax.jit(fn)
    return _JITTED[key]


def _cudnn_attention(q, k, v, seg, branch):
    return attention.attention(q, k, v, seg, seg, impl="cudnn")


@pytest.mark.slow
@pytest.mark.parametrize("device", GPUS)
def test_each_gpu_path_equals_the_reference_with_32_by_8_heads(device):
    """Llama-3's 32 query heads over 8 KV heads, through the kernel each simulated GPU gets for each layout (cuDNN
    through the emulator, Triton in interpret mode): the reference's values and gradients, to bf16 rounding."""
    q, k, v = _qkv(2, 64, 32, 8, 16)
    with cudnn_emulator.emulate(device):
        for layout, rows in LAYOUTS.items():
            seg = jnp.asarray(rows(2), jnp.int32)
            path = int(attention.fused_path(attention.segment_layout(seg)))
            assert path == {"whole rows": attention.WHOLE_ROWS, "one segment + padding": attention.ONE_SEGMENT,
                            "packed": attention.PACKED, "left padding": attention.MASKED}[layout]
            _check_against_reference(q, k, v, seg, _cudnn_attention)
    _JITTED.clear()


def test_packed_cudnn_rows_need_the_kv_repeat_exactly_on_jax_before_0_11_1(monkeypatch):
    """jax before 0.11.1 strides the packed path's key/value offsets by the query heads: with 32/8 heads its
    segments read 4x too far (past the buffer here: no output), so the kernel path repeats the key/value heads. From
    0.11.1 the offsets are right and the grouped heads go in as they are. Checked on this jax both ways."""
    q, k, v = _qkv(2, 64, 32, 8, 16)
    seg = jnp.asarray(LAYOUTS["packed"](2), jnp.int32)
    real = np.asarray(seg > 0)[:, :, None, None]
    ref = np.asarray(attention.reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), seg, seg))
    chosen = kernel_choice.segment_kernels
    results = {}
    for repeat in (True, False):
        monkeypatch.setattr(kernel_choice, "segment_kernels", lambda *a, r=repeat: __import__("dataclasses").replace(
            chosen(*a), repeat_kv=r))
        with cudnn_emulator.emulate("h100"):
            out = np.asarray(attention.attention(q, k, v, seg, seg, impl="cudnn").astype(jnp.float32))
        results[repeat] = bool(np.isfinite(np.where(real, out, 0)).all()) and float(
            np.abs(np.where(real, out - ref, 0)).max()) < 3e-2
    assert results[True]
    assert results[False] == (devices.jax_version() >= kernel_choice.GQA_OFFSETS_FIXED_JAX), results


# ------------------------------------------------------------------------------------ prefix-shared pair rows
def _pair_rows(t=128, left=False):
    """Two pair rows [history | chosen | rejected] + padding (row 1 left-padded with `left`), branch ids 0/1/2."""
    seg = np.zeros((2, t), np.int32)
    br = np.zeros((2, t), np.int32)
    for i, (h, c, r) in enumerate(((40, 30, 20), (70, 10, 25))):
        start = t - (h + c + r) if left and i == 1 else 0
        seg[i, start:start + h + c + r] = 1
        br[i, start + h:start + h + c] = 1
        br[i, start + h + c:start + h + c + r] = 2
    return jnp.asarray(seg), jnp.asarray(br)


@pytest.mark.parametrize("left", [False, True])
def test_branch_rows_take_exactly_the_pair_attention(left):
    """Each branch's own row [history, branch] on a kernel with sequence lengths (xla's here) gives every token the
    attention of the branch mask, values and gradients (the history's gradient summed over both rows)."""
    seg, br = _pair_rows(left=left)
    q, k, v = _qkv(2, 128, 4, 2, 16, seed=1)
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    fn = lambda q, k, v, s, b: attention.branch_rows_attention(q, k, v, s, b, impl="xla", scale=16 ** -0.5)  # noqa
    _check_against_reference(q, k, v, seg, fn, branch=br, tol=(1e-5, 1e-5))


def test_branch_rows_refuse_other_layouts_loudly():
    """A row that is not [history | branch 1 | branch 2] (here: a branch-1 token inside branch 2) gives NaN on its
    real tokens; the other row is untouched."""
    seg, br = _pair_rows()
    br = br.at[0, 80].set(1)
    q, k, v = (x.astype(jnp.float32) for x in _qkv(2, 128, 4, 2, 16))
    out = jax.jit(lambda *a: attention.branch_rows_attention(*a, impl="xla", scale=0.25))(q, k, v, seg, br)
    assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())


def test_take_tokens_backward_is_the_gather_transpose():
    """The deterministic backward (a sum of gathers through the inverse) equals autodiff's scatter-add."""
    rows = attention.branch_rows(*_pair_rows())
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2 * 128, 3)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).normal(size=(2 * 2 * 128, 3)), jnp.float32)
    ours = jax.grad(lambda x: jnp.sum(attention.take_tokens(x, rows.src, rows.src_inverse) * w))(x)
    plain = jax.grad(lambda x: jnp.sum(jnp.where((rows.src >= 0)[:, None], x[jnp.maximum(rows.src, 0)], 0) * w))(x)
    np.testing.assert_allclose(ours, plain, atol=1e-6)
    assert float(jnp.abs(plain).max()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("device", GPUS + ("tpu-v5e",))
def test_pair_rows_on_each_devices_kernel_equal_the_reference(device):
    """The jobs' prefix-shared rows with 32/8 heads through the kernel each device gets (cuDNN with sequence lengths
    through the emulator; splash in interpret mode on the TPU), values and gradients."""
    seg, br = _pair_rows(left=True)
    q, k, v = _qkv(2, 128, 32, 8, 16, seed=2)
    with cudnn_emulator.emulate(device):
        impl = kernel_choice.attention_impl("auto", jnp.bfloat16, (128, 128), 16)
        assert impl == ("splash" if device.startswith("tpu") else "cudnn")
        _check_against_reference(q, k, v, seg, lambda q, k, v, s, b: attention.attention(
            q, k, v, s, s, impl=impl, q_branch_ids=b, kv_branch_ids=b), branch=br)


# --------------------------------------------------------------------------------------- lowered programs
def _job(name: str):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


MODEL = dict(hidden_size=256, intermediate_size=512, num_layers=1, num_heads=8, num_kv_heads=2, vocab_size=512,
             param_dtype="float32", compute_dtype="bfloat16")


def lowered_step(job: str, device: str, turn_len: int = 0, seq_len: int = 256, attention_impl: str = "auto"):
    """The StableHLO text of a job's real train step (`training.aot.lower_step`) lowered for a simulated device."""
    from sweet_jax import models
    from sweet_jax.parallel import sharding
    from sweet_jax.training import aot

    cfg = _job(job)
    if turn_len:
        cfg.data.pack_pairs = True
    model_cfg = models.LlamaConfig.preset("tiny", **MODEL, attention_impl=attention_impl)
    platform = {"gpu": "cuda", "tpu": "tpu"}[devices.preset(device).platform]
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    with devices.simulate(device):
        lowered, _ = aot.lower_step(cfg, model_cfg, mesh, seq_len, 2, "", turn_len, platforms=(platform,))
    return lowered.as_text()


def lowered_decode(device: str, page_size: int = 16) -> str:
    """The paged decode segment's program (`inference.slots`) lowered for a simulated device."""
    from sweet_jax import models
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.slots import SlotPrograms

    cfg = models.LlamaConfig.preset("tiny", **{**MODEL, "param_dtype": "bfloat16", "num_heads": 2,
                                               "hidden_size": 256})
    platform = {"gpu": "cuda", "tpu": "tpu"}[devices.preset(device).platform]
    with devices.simulate(device):
        progs = SlotPrograms(cfg, Placement.build(), 4, 256, chunk=64, page_size=page_size)
        assert progs.page_kernel
        params = jax.eval_shape(models.llama.unstack_layers, models.abstract_params(cfg))
        program = progs.decode_program(4, 256)
        return program.trace(params, jax.eval_shape(progs._zeros)).lower(lowering_platforms=(platform,)).as_text()


PROGRAMS = {
    "critic step": lambda d: lowered_step("critic_tiny", d),
    "DPO step on prefix-shared rows": lambda d: lowered_step("policy_tiny", d, turn_len=32),
    "paged decode step": lambda d: lowered_decode(d),
}


@pytest.mark.slow
@pytest.mark.parametrize("device", GPUS + ("tpu-v5e",))
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_each_jobs_program_holds_only_kernels_its_device_runs(device, program):
    """The program for each simulated device has its fused kernels (cuDNN and Triton on GPUs, Mosaic on the TPU)
    and none the device cannot run: no cuDNN packed layout before Hopper, nothing of another platform."""
    text = PROGRAMS[program](device)
    calls = kernel_choice.kernel_calls(text)
    families = {c.family for c in calls}
    assert families, "no fused kernel in the program"
    assert families <= ({"mosaic"} if device.startswith("tpu") else {"cudnn", "triton"}), families
    assert kernel_choice.unsupported_kernels(text, devices.preset(device)) == []
    if program == "DPO step on prefix-shared rows":  # the rows reach a kernel with no [.., T, T] operand
        assert kernel_choice.square_operands(text, 384) == []


@pytest.mark.slow
def test_the_old_dispatch_fails_before_hopper_and_the_check_sees_it(monkeypatch):
    """The code before per-device choices put cuDNN's packed branch in every GPU program (under `lax.switch`, which
    traces every branch). Built that way for an A100, jax's own check refuses it at trace time, as it did on a
    user's A100; built for an H100 (where it is legal) and audited as an A100's program, the check names it."""
    old = kernel_choice.SegmentKernels(packed="cudnn", general=None, repeat_kv=True)
    monkeypatch.setattr(attention, "segment_kernels", lambda *a: old)
    with pytest.raises(NotImplementedError, match="Hopper"):
        lowered_step("critic_tiny", "a100")
    text = lowered_step("critic_tiny", "h100")
    problems = kernel_choice.unsupported_kernels(text, devices.preset("a100"))
    assert problems and all("packed layout" in p for p in problems), problems
    assert kernel_choice.unsupported_kernels(text, devices.preset("h100")) == []


@pytest.mark.slow
def test_the_old_prefix_shared_path_passed_a_dense_mask_and_the_check_sees_it(monkeypatch):
    """Before, branch ids sent cuDNN an explicit [B, 1, T, T] mask: the same program read for square operands
    names it (the check can fail)."""
    monkeypatch.setattr(attention, "branch_rows_attention", lambda q, k, v, seg, br, **kw: attention._masked_fused(
        q, k, v, seg, seg, impl=kw["impl"], scale=kw["scale"], q_branch_ids=br, kv_branch_ids=br))
    text = lowered_step("policy_tiny", "a100", turn_len=32)
    assert kernel_choice.square_operands(text, 384), "the masked path's bias operand was not found"


# ------------------------------------------------------------------------------------------ matmul precision
@pytest.mark.parametrize("compute,setting,want", [("float32", "auto", "HIGHEST"), ("bfloat16", "auto", "DEFAULT"),
                                                  ("float32", "tensorfloat32", "HIGH"),
                                                  ("float32", "default", "DEFAULT")])
def test_the_models_products_run_at_its_matmul_precision(compute, setting, want):
    """f32 models multiply as true f32 by default (a GPU's default for f32 is TF32, ~1e-3 off), in the forward
    pass and in a training loss alike; bf16 models at the device default; an explicit setting wins. Read from the
    lowered programs' dot products."""
    import re

    from sweet_jax import models
    from sweet_jax.training import steps

    cfg = models.LlamaConfig.preset("tiny", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                                    num_heads=2, num_kv_heads=1, compute_dtype=compute, matmul_precision=setting)
    params = models.init_params(cfg, jax.random.key(0))
    tokens = jnp.zeros((2, 8), jnp.int32)
    forward = jax.jit(lambda p, x: models.forward_hidden(p, cfg, x)).lower(params, tokens).as_text()
    batch = {"tokens": tokens, "positions": jnp.broadcast_to(jnp.arange(8), (2, 8)),
             "segment_ids": jnp.ones((2, 8), jnp.int32), "gather_pos": jnp.ones((2, 8), jnp.int32),
             "gather_score": jnp.ones((2, 8), bool), "gather_nll": jnp.ones((2, 8), bool),
             "gather_turn": jnp.zeros((2, 8), jnp.int32)}
    loss = jax.jit(lambda p, b: steps.loss_fn(p, b, objective="sft", model_cfg=cfg, loss_cfg={}, chunk=8)[0])
    for text in (forward, loss.lower(params, batch).as_text()):
        found = set(re.findall(r"precision = \[(\w+), \w+\]", text))
        assert found == {want}, found


def test_a_job_asking_for_a_kernel_its_device_cannot_run_stops_before_reading_data(tmp_path):
    """`model.attention_impl=cudnn` on a V100: the job's model config is refused at once, naming the device and why;
    on an A100 it is accepted."""
    import ml_collections

    from sweet_jax import models

    section = ml_collections.ConfigDict(dict(hf_path="", preset="tiny", preset_overrides={}, param_dtype="float32",
                                             compute_dtype="bfloat16", remat_policy="none", attention_impl="cudnn",
                                             matmul_precision="auto"))
    with devices.simulate("v100"):
        with pytest.raises(models.ConfigError, match=r"model.attention_impl: .*Tesla V100.*sm80"):
            models.model_config(section)
    with devices.simulate("a100"):
        assert models.model_config(section).attention_impl == "cudnn"


@pytest.mark.slow
def test_the_triton_kernel_runs_per_shard_under_a_mesh():
    """Under data=2 x tensor=2, the Triton flash kernel (interpret mode, a simulated A100) runs on each shard's rows
    and heads through shard_map, with the unsharded result: XLA has no partitioning rule for a Pallas call and
    would otherwise gather its operands onto every device."""
    from multidevice import run_with_devices

    out = run_with_devices("""
        import jax, jax.numpy as jnp, numpy as np
        from importlib import import_module
        from sweet_jax.models import kernel_choice
        from sweet_jax.parallel import devices, sharding
        attention = import_module("sweet_jax.models.attention")
        rng = np.random.default_rng(0)
        q = jnp.asarray(rng.normal(size=(4, 64, 8, 16)), jnp.bfloat16)
        k, v = (jnp.asarray(rng.normal(size=(4, 64, 2, 16)), jnp.bfloat16) for _ in range(2))
        seg = jnp.asarray(np.concatenate([np.zeros((4, 16)), np.ones((4, 48))], 1), jnp.int32)  # left padding
        blocks = kernel_choice.triton_blocks(devices.preset("a100"), 64, 16)
        fn = lambda q, k, v, s: attention.triton_segment_attention(q, k, v, s, scale=0.25, blocks=blocks,
                                                                   interpret=True)
        alone = jax.jit(fn)(q, k, v, seg)
        mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 2})
        with sharding.use_mesh(mesh):  # a new function: jit's trace cache does not see the active mesh
            per_device = jax.jit(lambda *a: fn(*a))
            text = per_device.lower(q, k, v, seg).as_text()
            sharded = per_device(q, k, v, seg)
        real = np.asarray(seg > 0)[:, :, None, None]
        diff = float(np.abs(np.where(real, np.asarray(sharded, np.float32) - np.asarray(alone, np.float32), 0)).max())
        print("TRITON", any(m in text for m in ("SPMDFullToShardShape", "sdy.manual_computation")), diff)
    """, n=4)
    line = next(x for x in out.splitlines() if x.startswith("TRITON"))
    _, mapped, diff = line.split()
    assert mapped == "True" and float(diff) == 0.0, line
