"""The text of `python -m sweet_jax.plan`: the fake devices it plans on (`fake_cpu_devices`), the mesh given on its
command line (`parse_mesh`) and the plan report (`format_plan`) of `training.aot.plan_job`'s result. Imports no JAX
at import time: the command sets up its fake devices first."""

from __future__ import annotations

import os

# XLA:CPU multiplies bf16 in f32: it converts each bf16 weight it multiplies, and the loop-invariant code motion
# pass then hoists those converts out of the layer loop, an f32 copy of every stacked bf16 weight at once (26 GiB
# of an 8B model's bf16 base). GPUs and TPUs multiply bf16 as it is, so a plan of bf16 params turns that pass off.
NO_HOISTED_CONVERTS = "--xla_disable_hlo_passes=while-loop-invariant-code-motion"
# A plan compiles its programs for the fake devices and never runs them: it reads XLA's buffer assignment, which comes
# before LLVM. LLVM at -O0 without its expensive passes gives the same figures (a 4-layer critic_tiny plan on fsdp=2:
# every byte the same, 2.7 s of compiling against 4.6 on 2 cores, 2026-12-07).
NO_CODEGEN_EFFORT = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
BF16_NOTE = ("note: {dtype} params: planned without XLA:CPU's hoisted f32 copies of the weights ("
             + NO_HOISTED_CONVERTS + "; GPUs and TPUs multiply bf16 as it is)")


class PlanError(ValueError):
    pass


def fake_cpu_devices(devices: int, bf16_params: bool = False) -> None:
    """Fake CPU devices, set before jax starts: a plan needs no accelerator and allocates nothing, and its programs
    never run (`NO_CODEGEN_EFFORT`). With `bf16_params`, XLA:CPU's hoisting of f32 weight copies is off
    (`NO_HOISTED_CONVERTS`)."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               f"--xla_force_host_platform_device_count={devices} {NO_CODEGEN_EFFORT}"
                               + (f" {NO_HOISTED_CONVERTS}" if bf16_params else "")).strip()


def parse_mesh(text: str | None, config_mesh: dict, devices: int | None) -> tuple[dict, int]:
    """({axis: size}, device count) from "fsdp=8"-style text (or the config's mesh): `parallel.sharding.parse_mesh`,
    its errors as PlanError."""
    from sweet_jax.parallel import sharding

    try:
        return sharding.parse_mesh(text, config_mesh, devices)
    except ValueError as e:
        raise PlanError(str(e)) from None


def plan_document(result: dict, mesh_sizes: dict, hbm_gib: float) -> dict:
    """The plan as `--json` writes it."""
    return {"mesh": mesh_sizes, "hbm_gib": hbm_gib, "fits": result["fits"], "suggestion": result["suggestion"],
            "plan": result["plan"].as_dict(), "alternatives": [a.as_dict() for a in result["alternatives"]],
            "device_kernels": result.get("device_kernels")}


def _gib(x: float) -> str:
    return f"{x / 2 ** 30:8.2f} GiB"


def format_plan(result: dict, cfg, model_cfg, mesh_sizes: dict, hbm_gib: float, arch_note: str) -> str:
    """The plan report; with `result["device_kernels"]` (`aot.device_kernels`), the kernels a device would run."""
    text = _format_memory(result, cfg, model_cfg, mesh_sizes, hbm_gib, arch_note)
    if result.get("device_kernels"):
        text += "\n" + format_device_kernels(result["device_kernels"])
    return text


def _format_memory(result: dict, cfg, model_cfg, mesh_sizes: dict, hbm_gib: float, arch_note: str) -> str:
    p = result["plan"]
    n = p.devices
    from sweet_jax.training.objective_registry import objective  # after main() has set up the devices

    spec = objective(cfg.objective)
    unit = spec.unit
    shards = mesh_sizes['data'] * mesh_sizes['fsdp']
    if p.turn_len:
        padded = p.row_len - p.seq_len - p.turn_len
        batch_line = (f"micro-batch: {p.micro_batch_size} {unit} = {p.sequences} prefix-shared rows x {p.row_len} "
                      f"tokens (a {p.seq_len - p.turn_len}-token history, then two {p.turn_len}-token turns"
                      + (f", {padded} tokens of padding to the row bucket" if padded else "")
                      + "), every token of both examples scored (worst case)")
    else:
        batch_line = (f"micro-batch: {p.micro_batch_size} {unit} = {p.sequences} sequences x {p.seq_len} tokens, "
                      f"every token scored (worst case)")
    lines = [
        f"plan: objective {cfg.objective} on mesh {mesh_sizes} ({n} devices)"
        + (f", rules {cfg.mesh.rules}" if cfg.mesh.rules else ""),
        f"model: {model_cfg.num_params() / 1e9:.2f}B params{arch_note}; params {model_cfg.param_dtype}, compute "
        f"{model_cfg.compute_dtype}, remat {model_cfg.remat_policy}, attention {model_cfg.attention_impl}"
        + (" (the blockwise einsum on these CPU devices; GPU/TPU kernels need less)"
           if model_cfg.attention_impl == "auto" else ""),
        f"{batch_line}; {p.sequences * p.row_len // shards} tokens per batch shard",
    ]
    if not p.turn_len and spec.packing == "pairs" and cfg.data.pack_pairs:
        lines.append("  note: pairs that share a history train as one row each (data.pack_pairs), which needs less: "
                     "plan that with --turn-len N (tokens of each pair's own turn)")
    if p.micro_batch_size != int(cfg.optim.micro_batch_size):
        lines.append(f"  note: optim.micro_batch_size={cfg.optim.micro_batch_size} does not split over the "
                     f"{shards} batch shards (data x fsdp); planned with "
                     f"{p.micro_batch_size}, the smallest that does, as the trainer requires (set "
                     f"--config.optim.micro_batch_size={p.micro_batch_size} and optim.batch_size to a multiple)")
    lines += [
        "per device (XLA memory analysis of the compiled step):",
        f"  params            {_gib(p.params_bytes)}",
        f"  optimiser state   {_gib(p.opt_state_bytes)}  (Adam moments, accumulated gradients)",
        f"  arguments         {_gib(p.argument_bytes)}  (state + batch)",
        f"  outputs           {_gib(p.output_bytes)}  ({_gib(p.alias_bytes).strip()} written in place over donated "
        f"arguments)",
        f"  temporaries       {_gib(p.temp_bytes)}  (activations kept for the backward pass, working set)",
    ]
    if p.frozen_reference_bytes:
        lines.append(f"  frozen reference  {_gib(p.frozen_reference_bytes)}  (loss.reference=recompute)")
    lines += [
        f"  total             {_gib(p.total_bytes)}  {'<=' if result['fits'] else '>'} budget {hbm_gib:g} GiB",
        f"model FLOPs per micro-step: {p.model_flops:.3e} ({p.model_flops / n:.3e} per device)",
        f"compiled in {p.compile_seconds:.1f} s",
    ]
    if result["fits"]:
        lines.append("verdict: FITS")
        return "\n".join(lines)
    for alt in result["alternatives"]:
        rules = f", rules {alt.rules}" if alt.rules != cfg.mesh.rules else ""
        lines.append(f"  with remat_policy={alt.remat_policy}{rules}: total {_gib(alt.total_bytes).strip()} "
                     f"(temporaries {_gib(alt.temp_bytes).strip()})")
    if result["suggestion"]:
        lines.append(f"verdict: OVER BUDGET; fits with {result['suggestion']}")
    else:
        best = min([p] + result["alternatives"], key=lambda q: q.total_bytes)
        lines.append(f"verdict: OVER BUDGET with every remat policy (least: {_gib(best.total_bytes).strip()} with "
                     f"remat_policy={best.remat_policy}); use more devices, a tensor axis with sequence parallelism "
                     f"(--mesh ...,tensor=N --config.mesh.rules=act_seq=tensor), or shorter sequences")
    return "\n".join(lines)


def format_device_kernels(kernels: dict) -> str:
    """`aot.device_kernels`' result as lines: the kernels by family, then why each one the device cannot run fails."""
    found = ", ".join(f"{name} x{n}" for name, n in sorted(kernels["kernels"].items())) or "none"
    return "\n".join([f"kernels on {kernels['device']}: {found}"] +
                     [f"  cannot run there: {problem}" for problem in kernels["unsupported"]])
