"""Where a step's device time goes: run a bench step under the JAX profiler and print its ops by device time, grouped.

    python bench/profile_step.py critic                      # the critic train step of bench/mfu.py (1B, 2 x 4096)
    python bench/profile_step.py critic --segments 4         # the same rows, four packed documents each
    python bench/profile_step.py decode --model llama3.1-8b --batch 64 --prompt 2048     # the serving decode segment
    python bench/profile_step.py critic --layers 1 --hidden 64 --seq 256 --preset tiny   # a CPU run in seconds

Every op the profiler saw run is put in one group, by the first rule that matches:
- collectives: all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all;
- copies: the KV cache write (the model's "kv_write" scope), copy, transpose, dynamic-update-slice;
- attention: ops under the model's "attention" scope, and fused attention kernels (cuDNN fmha, splash);
- log-prob: ops under the "logprob" scope (the vocabulary projection and log-softmax of `objectives.logprobs`);
- matmul: the remaining dots (and fusions that hold one), convolutions, GEMM custom calls;
- norm/elementwise: everything else.
An op's names are those of its HLO instruction and, for a fusion, of every instruction fused into it (the optimized
HLO, dumped by XLA at compile time). Each op is also marked forward, backward or other (optimizer, sampling) by the
names JAX gives differentiated code: backward ops carry "transpose(", forward ones "jvp(".

The same script runs on CPU, GPU and TPU: on an accelerator it reads the device's "XLA Ops" timeline, on CPU the
host threads' op events. The profile directory is kept (--profile-dir) for TensorBoard or Perfetto.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile

GROUPS = ("matmul", "attention", "log-prob", "norm/elementwise", "copies", "collectives")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all", "collective-broadcast")
CONTAINERS = ("while", "conditional", "call", "async-start", "async-done")
COPIES = ("copy", "copy-start", "copy-done", "transpose", "dynamic-update-slice")


# ------------------------------------------------------------------------------------------------- optimized HLO
class HloOp:
    """One instruction of an optimized HLO module: its opcode, the names it carries, what it calls."""

    def __init__(self, opcode: str, op_name: str, calls: list[str], target: str):
        self.opcode, self.op_name, self.calls, self.target = opcode, op_name, calls, target


def _split_instruction(line: str):
    """'  ROOT %x = f32[2]{0} add(%a, %b), metadata={...}' -> ('x', 'add', the rest); None for other lines."""
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)$", line)
    if not m:
        return None
    name, rest = m.groups()
    if rest.startswith("("):  # a tuple type: skip to its closing parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                rest = rest[i + 1:].lstrip()
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    op = re.match(r"([\w\-]+)\(", rest)
    return (name, op.group(1), rest) if op else None


def parse_hlo(text: str) -> tuple[str, dict, dict]:
    """(module name, {computation: [instruction names]}, {instruction name: HloOp}) of an HLO module's text."""
    module = re.match(r"HloModule ([\w.\-]+)", text)
    comps: dict[str, list[str]] = {}
    ops: dict[str, HloOp] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"(?:ENTRY )?%([\w.\-]+) \(.*\{\s*$", line)
        if head:
            current = comps.setdefault(head.group(1), [])
            continue
        parsed = _split_instruction(line)
        if parsed is None or current is None:
            continue
        name, opcode, rest = parsed
        op_name = re.search(r'op_name="([^"]*)"', rest)
        target = re.search(r'custom_call_target="([^"]*)"', rest)
        calls = re.findall(r"(?:calls|to_apply|body|condition|branch_computations)=\{?(%[\w.\-]+(?:, %[\w.\-]+)*)",
                           rest)
        ops[name] = HloOp(opcode, op_name.group(1) if op_name else "", [c.strip().lstrip("%") for group in calls
                                                                         for c in group.split(",")],
                          target.group(1) if target else "")
        current.append(name)
    return (module.group(1) if module else "?"), comps, ops


def _fused(op: HloOp, comps: dict, ops: dict) -> list[HloOp]:
    """The op, and for a fusion the instructions fused into it (nested fusions included)."""
    out, todo = [op], list(op.calls) if op.opcode == "fusion" else []
    while todo:
        for name in comps.get(todo.pop(), []):
            inner = ops[name]
            out.append(inner)
            if inner.opcode == "fusion":
                todo.extend(inner.calls)
    return out


def classify(op: HloOp, comps: dict, ops: dict) -> tuple[str, str]:
    """(group, pass) of one executed op: the group by the module docstring's rules, the pass "forward", "backward"
    or "other"."""
    parts = _fused(op, comps, ops)
    names = " ".join(p.op_name for p in parts)
    opcodes = {p.opcode for p in parts}
    targets = " ".join(p.target for p in parts).lower()
    phase = "backward" if "transpose(" in names else "forward" if "jvp(" in names else "other"
    if any(o.removesuffix("-start").removesuffix("-done") in COLLECTIVES for o in opcodes):
        return "collectives", phase
    if "kv_write" in names:
        return "copies", phase
    if "attention" in names or any(k in targets for k in ("fmha", "flash", "splash", "attention")):
        return "attention", phase
    if "logprob" in names:
        return "log-prob", phase
    if opcodes & {"dot", "convolution"} or any(k in targets for k in ("gemm", "matmul", "cublas")):
        return "matmul", phase
    if op.opcode in COPIES or (op.opcode == "fusion" and opcodes - {"fusion", "parameter", "bitcast"} <= set(COPIES)):
        return "copies", phase
    return "norm/elementwise", phase


def load_modules(dump_dir: str) -> dict[str, tuple[dict, dict]]:
    """{module name: (computations, ops)} of every optimized module XLA dumped."""
    modules = {}
    for path in glob.glob(os.path.join(dump_dir, "*after_optimizations.txt")):
        with open(path) as fh:
            name, comps, ops = parse_hlo(fh.read())
        modules[name] = (comps, ops)
    return modules


# ------------------------------------------------------------------------------------------------- the profile
def op_events(xplane_path: str):
    """(module, op, seconds) of every HLO op execution in a profile: the device planes' "XLA Ops" lines where there
    are any (GPU, TPU), otherwise the host's op events (XLA:CPU)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(xplane_path)
    device_lines = [(plane, line) for plane in data.planes if plane.name.startswith("/device:")
                    for line in plane.lines if line.name == "XLA Ops"]
    if device_lines:
        for _plane, line in device_lines:
            for ev in line.events:
                stats = dict(ev.stats)
                yield str(stats.get("hlo_module", "")), ev.name.lstrip("%"), ev.duration_ns * 1e-9
        return
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                if "hlo_op" in stats and not ev.name.startswith("end:"):
                    yield str(stats.get("hlo_module", "")), str(stats["hlo_op"]), ev.duration_ns * 1e-9


def summarize(events, modules: dict, steps: int, top: int = 15) -> dict:
    """Device seconds per step by group, by pass, and the `top` ops, from `op_events` and `load_modules`."""
    by_op: dict[tuple, list] = {}
    for module, name, seconds in events:
        comps, ops = modules.get(module, (None, None))
        if ops is None:  # the profiler names modules with or without the jit_ prefix and a suffix
            match = next((m for m in modules if module and (m.startswith(module) or module.startswith(m))), None)
            comps, ops = modules.get(match, ({}, {}))
        op = ops.get(name)
        if op is not None and op.opcode in CONTAINERS:  # its body's ops have events of their own
            continue
        group, phase = classify(op, comps, ops) if op is not None else ("norm/elementwise", "other")
        entry = by_op.setdefault((module, name), [0.0, 0, group, phase, op.op_name if op else ""])
        entry[0] += seconds
        entry[1] += 1
    total = sum(e[0] for e in by_op.values()) or 1e-30
    groups = collections.Counter()
    phases = collections.Counter()
    for seconds, _count, group, phase, _ in by_op.values():
        groups[group] += seconds
        phases[phase] += seconds
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": steps, "device_s_per_step": total / steps,
        "groups": {g: groups[g] / steps for g in GROUPS},
        "passes": {p: phases[p] / steps for p in ("forward", "backward", "other")},
        "top": [{"module": m, "op": n, "group": e[2], "pass": e[3], "s_per_step": e[0] / steps,
                 "calls_per_step": e[1] / steps, "op_name": e[4]} for (m, n), e in ranked],
    }


def print_summary(summary: dict, title: str) -> None:
    total = summary["device_s_per_step"]
    print(f"{title}: device time {total * 1e3:.3f} ms per step (over {summary['steps']} profiled steps)")
    print(f"{'group':<18}{'ms/step':>10}{'share':>8}")
    for group, seconds in summary["groups"].items():
        print(f"{group:<18}{seconds * 1e3:>10.3f}{100 * seconds / total:>7.1f}%")
    fwd, bwd = summary["passes"]["forward"], summary["passes"]["backward"]
    print("passes: " + ", ".join(f"{p} {s * 1e3:.3f} ms" for p, s in summary["passes"].items())
          + (f"; backward / forward {bwd / fwd:.2f}x" if fwd > 0 else ""))
    print(f"top {len(summary['top'])} ops:")
    print(f"{'ms/step':>9} {'calls':>6}  {'group':<17}{'pass':<9}op (names)")
    for row in summary["top"]:
        names = row["op_name"]
        names = names if len(names) <= 70 else "..." + names[-67:]
        print(f"{row['s_per_step'] * 1e3:>9.3f} {row['calls_per_step']:>6.1f}  {row['group']:<17}{row['pass']:<9}"
              f"{row['op']} ({names})")


# ------------------------------------------------------------------------------------------------- steps
def critic_runner(args):
    """(title, run one step) for the critic train step of bench/mfu.py."""
    import jax
    import mfu

    built = mfu.build_critic_step(args, args.attention)
    state = {"state": built.state}

    def run():
        state["state"], metrics = built.step(state["state"], built.batch)
        jax.block_until_ready(metrics)

    return (f"critic step: {built.rows} x {built.seq} tokens, {built.cfg.num_params() / 1e9:.3g}B params, "
            f"{args.segments} segment(s) per row, attention {args.attention}, remat {args.remat}"), run


def decode_runner(args):
    """(title, run one segment of `--decode-steps` decode steps) for the serving engine's decode program."""
    import jax
    import decode_mbu

    built = decode_mbu.build_decode(args.model, args.batch, args.prompt, args.decode_steps, args.dtype,
                                    segments=args.steps + max(args.warmup, 1))
    state = {"state": built.state}

    def run():
        state["state"], out, _ = built.progs.decode(built.params, state["state"], args.decode_steps, built.context)
        jax.block_until_ready(out)

    return (f"decode segment: {args.model}, batch {args.batch}, {args.prompt}-token prompts, "
            f"{args.decode_steps} steps"), run


def profile(run, steps: int, warmup: int, profile_dir: str):
    """Run `run` warmup times, then `steps` times under the profiler; the xplane file's path."""
    import jax

    for _ in range(warmup):
        run()
    with jax.profiler.trace(profile_dir):
        for _ in range(steps):
            run()
    found = sorted(glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not found:
        raise SystemExit(f"the profiler wrote no .xplane.pb under {profile_dir}")
    return found[-1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    critic = sub.add_parser("critic", help="the critic train step (bench/mfu.py)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import decode_mbu
    import mfu

    mfu.add_step_arguments(critic)
    decode = sub.add_parser("decode", help="the serving engine's decode segment (bench/decode_mbu.py)")
    decode.add_argument("--model", default="llama3.2-1b")
    decode.add_argument("--batch", type=int, default=16)
    decode.add_argument("--prompt", type=int, default=512)
    decode.add_argument("--decode-steps", type=int, default=32, help="decode steps per profiled segment")
    decode.add_argument("--dtype", default="bfloat16")
    decode.add_argument("--steps", type=int, default=3, help="profiled segments")
    decode.add_argument("--warmup", type=int, default=1)
    for sp in (critic, decode):
        sp.add_argument("--top", type=int, default=15, help="ops listed")
        sp.add_argument("--profile-dir", default=None, help="keep the profile here (default: a temporary directory)")
        sp.add_argument("--json", default=None, help="also write the summary here")
    args = p.parse_args(argv)
    if args.step == "critic":
        args.steps = min(args.steps, 5)  # mfu's default of 10 timed steps: 5 profiled ones say as much

    dump_dir = tempfile.mkdtemp(prefix="profile_step_hlo_")
    if "jax" in sys.modules:
        raise SystemExit("profile_step must set XLA_FLAGS before jax is imported")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
    title, run = (critic_runner if args.step == "critic" else decode_runner)(args)
    xplane = profile(run, args.steps, max(args.warmup, 1), args.profile_dir or tempfile.mkdtemp(prefix="profile_"))
    summary = summarize(op_events(xplane), load_modules(dump_dir), args.steps, args.top)
    import jax

    summary.update(title=title, device=jax.devices()[0].device_kind, profile=xplane)
    print_summary(summary, f"{title} on {summary['device']}")
    if args.json:
        from sweet_jax.files.atomic import write_json

        write_json(args.json, summary, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
