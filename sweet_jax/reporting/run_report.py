"""A pipeline run's report (`python -m sweet_jax.report RUN_DIR [--output DIR]`): Markdown plus PNG plots.
`python -m sweet_jax.report RUN_1 RUN_2 ...` (one config, several seeds) writes each run's report and `seeds.md`: every
run's success rates side by side and pooled over the runs, with 95% Wilson intervals.

- `report.md`: what ran (stages, times, data source), the results table in the layout of the paper's Table 2 (one
  row per evaluated method: % tests passed and success rate on the test tasks, with 95% Wilson intervals for the
  success rate), and the training stages' final held-out metrics.
- `training_curves.png`: per training stage, the train loss and the held-out accuracy against the step (from each
  stage's `log.jsonl`; after a resume the last line per step counts).
- `best_of_n.png` and a table: the best-of-N curves of the paper's Figure 3a with 95% Wilson intervals, when the run
  has a best-of-N evaluation (`eval/best_of_n.json`, from `sweet_jax.best_of_n evaluate`: {"success": {selector:
  {N: rate}}, "episodes": {selector: {N: count}}, ...}).

- On a testbed run (`task_type = "testbed"`), and in its seeds' `seeds.md`: every judge and every policy against the
  ground truth, as tables and `critic_diagnostics.png` (`reporting.testbed_report`).

The output goes to RUN_DIR/report by default, written atomically file by file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from sweet_jax.cli.app import flag
from sweet_jax.files.atomic import atomic_file, write_text
from sweet_jax.files.jsonl import read_jsonl
from sweet_jax.reporting.testbed_report import TESTBED_METHODS, critic_by_kind, testbed_sections
from sweet_jax.runs.run_layout import RunLayout, report_file

# The evaluation stages of `sweet_jax.pipeline`, by the method they measure, in table order.
METHODS = {"test_zero_shot": "Zero-shot", "test_rft": "Rejection fine-tuning", "test_mtdpo": "Multi-turn DPO",
           "test": "SWEET-RL"}
FRONTEND_METHODS = {**METHODS, "test": "SWEET-RL (text critic)", "test_vision": "SWEET-RL (vision critic)"}
BASELINE = "test_zero_shot"  # the frontend win rate's baseline offline: the zero-shot policy's pages
TRAINING = ("pretrain", "critic", "critic_no_info", "critic_head", "critic_value", "critic_vision", "policy",
            "policy_vision", "policy_no_info", "policy_sum", "rft", "mtdpo")


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def read_log(path: str) -> dict[str, list[dict]]:
    """{split: points sorted by step}, the last line winning for a repeated (split, step)."""
    points: dict[tuple[str, int], dict] = {}
    with open(path) as fh:
        for line in fh:
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # cut by a crash (the job then resumed and logged those steps again)
                    continue
                points[(rec["split"], rec["step"])] = rec
    out: dict[str, list[dict]] = {}
    for (split, _), rec in sorted(points.items(), key=lambda kv: kv[0][1]):
        out.setdefault(split, []).append(rec)
    return out


def _markers(run_dir: str) -> dict[str, dict]:
    layout = RunLayout(run_dir)
    out = {}
    for name in layout.finished():
        with open(layout.marker(name)) as fh:
            out[name] = json.load(fh)
    return out


def _save(fig, path: str) -> None:
    with atomic_file(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120, bbox_inches="tight")


def training_curves(run_dir: str, out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in TRAINING if os.path.exists(RunLayout(run_dir).training_log(s))]
    if not stages:
        return []
    fig, axes = plt.subplots(len(stages), 2, figsize=(10, 3.2 * len(stages)), squeeze=False)
    for row, stage in zip(axes, stages):
        log = read_log(RunLayout(run_dir).training_log(stage))
        for ax, metric in zip(row, ("loss", "accuracy")):
            train = [p for p in log.get("train", []) if metric in p]
            held = [p for p in log.get("eval", []) if metric in p]
            if not train and not held:
                ax.text(0.5, 0.5, f"no {metric} for this objective", ha="center", va="center",
                        transform=ax.transAxes)
                ax.set_axis_off()
                continue
            if train:
                steps, values = [p["step"] for p in train], [p[metric] for p in train]
                ax.plot(steps, values, "-", color="tab:blue", alpha=0.35, lw=1, label="train")
                w = max(3, len(values) // 10)  # a running mean over a tenth of the points, at least 3
                if len(values) > w:
                    smooth = [sum(values[max(0, i - w + 1):i + 1]) / len(values[max(0, i - w + 1):i + 1])
                              for i in range(len(values))]
                    ax.plot(steps, smooth, "-", color="tab:blue", lw=2, label=f"train, running mean of {w}")
            if held:
                ax.plot([p["step"] for p in held], [p[metric] for p in held], "o-", color="tab:orange",
                        label="held-out")
            values = [p[metric] for p in train + held]
            if metric == "loss" and min(values) > 0 and max(values) / min(values) > 100:
                ax.set_yscale("log")  # pre-training falls from ~10 to ~0.01: the end would be a flat line
            ax.set_title(f"{stage}: {metric}")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    path = report_file(out, "training_curves.png")
    _save(fig, path)
    plt.close(fig)
    return [path]


def best_of_n_curve(run_dir: str, out: str) -> list[str]:
    src = RunLayout(run_dir).best_of_n
    if not os.path.exists(src):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, counts = read_best_of_n(src)
    intervals = best_of_n_intervals(src, curves, counts)
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    for i, (method, points) in enumerate(curves.items()):
        ns = sorted(points, key=int)
        x = [int(n) * 1.03 ** (i - len(curves) / 2) for n in ns]  # a small offset keeps the error bars apart
        y = [100 * points[n] for n in ns]
        cis = [intervals[method][n] for n in ns]
        err = [[yy - 100 * lo for yy, (lo, _) in zip(y, cis)], [100 * hi - yy for yy, (_, hi) in zip(y, cis)]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=method)
    ax.set_xscale("log", base=2)
    ticks = sorted({int(n) for points in curves.values() for n in points})
    ax.set_xticks(ticks, [str(n) for n in ticks])
    ax.set_xlabel("N (candidates per turn)")
    frontend = _best_of_n_metric(src) == "similarity"
    ax.set_ylabel("similarity x100" if frontend else "success rate (%)")
    ax.set_title(f"best-of-N selection (95% {'normal' if frontend else 'Wilson'} intervals)")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))  # outside: 7 curves leave no empty corner
    path = report_file(out, "best_of_n.png")
    _save(fig, path)
    plt.close(fig)
    return [path]


def _best_of_n_metric(path: str) -> str:
    with open(path) as fh:
        return "similarity" if "similarity" in json.load(fh) else "success"


def read_best_of_n(path: str) -> tuple[dict, dict]:
    """({selector: {N: success rate, or frontend mean similarity}}, {selector: {N: episodes}}) of a
    `sweet_jax.best_of_n evaluate` result."""
    with open(path) as fh:
        result = json.load(fh)
    return result["similarity" if "similarity" in result else "success"], result["episodes"]


def best_of_n_intervals(path: str, curves: dict, counts: dict) -> dict:
    """{selector: {N: (lo, hi)}}: the frontend's stored 95% normal intervals, else 95% Wilson intervals."""
    with open(path) as fh:
        stored = json.load(fh).get("similarity_ci")
    if stored:
        return {sel: {n: tuple(ci) for n, ci in points.items()} for sel, points in stored.items()}
    return {sel: {n: wilson(round(points[n] * counts[sel][n]), counts[sel][n]) for n in points}
            for sel, points in curves.items()}


def best_of_n_table(path: str) -> list[str]:
    curves, counts = read_best_of_n(path)
    intervals = best_of_n_intervals(path, curves, counts)
    ns = sorted({n for points in curves.values() for n in points}, key=int)
    lines = ["| selector | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---|" * len(ns)]
    for method, points in curves.items():
        cells = []
        for n in ns:
            lo, hi = intervals[method][n]
            cells.append(f"{100 * points[n]:.1f} ({100 * lo:.0f}-{100 * hi:.0f})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def best_of_n_section(path: str) -> list[str]:
    """The report's best-of-N heading, caption and table, or nothing without a best-of-N result."""
    if not os.path.exists(path):
        return []
    caption = ("Similarity x100 with the initial policy fixed, choosing among N candidates per turn by each critic (or "
               "at random); 95% normal interval in brackets." if _best_of_n_metric(path) == "similarity" else
               "Success rate (%) with the initial policy fixed, choosing among N candidates per turn; 95% Wilson "
               "interval in brackets.")
    return ["", "## Best-of-N selection on the test tasks (Figure 3a)", "", caption, ""] + best_of_n_table(path)


def _first_turns(path: str, group=lambda rec: None) -> dict:
    """{group(record): the fraction of those trajectories in `path` that open with the ask domain's good question},
    the file read once; {} without the file."""
    from sweet_jax.colbench.synthetic import opens_with_good_question

    if not os.path.exists(path):
        return {}
    counts: dict = {}
    with open(path) as fh:
        for rec in map(json.loads, filter(str.strip, fh)):
            good, total = counts.get(group(rec), (0, 0))
            counts[group(rec)] = (good + opens_with_good_question(rec), total + 1)
    return {k: good / total for k, (good, total) in counts.items()}


def normal_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """The mean's 95% normal interval (mean +- z standard errors)."""
    n = len(values)
    if n < 2:
        return (values[0], values[0]) if values else (0.0, 1.0)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)


def _per_task(records: list[dict]) -> dict[str, float]:
    """{task: its rollouts' mean reward}."""
    from sweet_jax.data.trajectories import task_key

    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(task_key(r["task"]), []).append(float(r["reward"]))
    return {k: sum(v) / len(v) for k, v in groups.items()}


@dataclasses.dataclass
class FrontendRow:
    """One method's frontend results over one or more runs: every episode's similarity, and its per-task outcomes
    against the baseline (1 higher, 1/2 tie, 0 lower)."""

    similarities: list[float]
    outcomes: list[float]
    drafts: int = 0  # episodes that open with a page (the design domain's good first move)

    def cells(self) -> str:
        sims = self.similarities
        lo, hi = normal_interval(sims)
        cell = f"{100 * sum(sims) / len(sims):.1f} | {100 * lo:.1f}-{100 * hi:.1f}"
        if self.outcomes:
            wlo, whi = normal_interval(self.outcomes)
            cell += (f" | {100 * sum(self.outcomes) / len(self.outcomes):.1f} | "
                     f"{100 * max(0.0, wlo):.1f}-{100 * min(1.0, whi):.1f}")
        else:
            cell += " | - | -"
        return cell + f" | {len(sims)} | {100 * self.drafts / len(sims):.0f}% |"


def frontend_rows(run_dirs: list[str]) -> dict[str, FrontendRow]:
    """{method stage: its `FrontendRow`} pooled over the runs: similarities of every test episode, win-rate outcomes
    per (run, task) against the run's zero-shot pages."""
    from sweet_jax.colbench.synthetic_frontend import opens_with_draft
    from sweet_jax.colbench.similarity import win_rate

    rows: dict[str, FrontendRow] = {}
    for d in run_dirs:
        base_path = RunLayout(d).episodes(BASELINE)
        base = _per_task(read_jsonl(base_path)) if os.path.exists(base_path) else None
        for stage in FRONTEND_METHODS:
            path = RunLayout(d).episodes(stage)
            if not os.path.exists(path):
                continue
            records = read_jsonl(path)
            row = rows.setdefault(stage, FrontendRow([], []))
            row.similarities += [float(r["reward"]) for r in records]
            row.drafts += sum(opens_with_draft(r) for r in records)
            if base is not None:
                ours = _per_task(records)
                row.outcomes += [win_rate([ours[t]], [base[t]]) for t in ours if t in base]
    return rows


FRONTEND_HEAD = ["| method | similarity x100 | 95% CI | win rate vs zero-shot % | 95% CI | trajectories | "
                 "opens with a page |", "|---|---|---|---|---|---|---|"]


def screenshots_page(run_dir: str, out: str, tasks: int = 6) -> list[str]:
    """`screenshots.png`: for the first test tasks (rollout 0), the target page beside each method's final page."""
    from PIL import Image, ImageDraw

    from sweet_jax.colbench.render_cache import page_hash
    from sweet_jax.colbench.similarity import load_image

    columns = [(stage, name) for stage, name in FRONTEND_METHODS.items()
               if os.path.exists(RunLayout(run_dir).episodes(stage))]
    if not columns:
        return []
    per_method = {stage: read_jsonl(RunLayout(run_dir).episodes(stage))[:tasks]
                  for stage, _ in columns}
    first = per_method[columns[0][0]]
    w, h, label = 273, 154, 18
    sheet = Image.new("RGB", ((1 + len(columns)) * (w + 6), len(first) * (h + label + 6) + label), "white")
    draw = ImageDraw.Draw(sheet)
    for c, title in enumerate(["target"] + [name for _, name in columns]):
        draw.text((c * (w + 6) + 4, 2), title, fill="black")
    for r, rec in enumerate(first):
        y = label + r * (h + label + 6)
        target = RunLayout(run_dir).screenshot(columns[0][0], page_hash(rec["task"]["ground_truth"]))
        cells = [(load_image(target), "")]
        for stage, _ in columns:
            match = per_method[stage][r] if r < len(per_method[stage]) else None
            cells.append((load_image(match["answer"]) if match else load_image(None),
                          f"{match['reward']:.2f}" if match else "-"))
        for c, (img, text) in enumerate(cells):
            thumb = img.copy()
            thumb.thumbnail((w, h))
            sheet.paste(thumb, (c * (w + 6), y + label))
            draw.text((c * (w + 6) + 4, y + 2), text or f"task {r}", fill="black")
    path = report_file(out, "screenshots.png")
    with atomic_file(path, "wb") as fh:
        sheet.save(fh, format="png")
    return [path]


def write_report(run_dir: str, out: str | None = None, against: str | None = None) -> str:
    """RUN_DIR/report/report.md (or in `out`); with `against`, another run of the same config and seed, each method
    set against that run's (`comparison_section`)."""
    run_dir = os.path.abspath(run_dir)
    markers = _markers(run_dir)
    if not markers:
        raise FileNotFoundError(f"{run_dir}: no finished pipeline stages (stages/*.json)")
    out = out or RunLayout(run_dir).report
    os.makedirs(out, exist_ok=True)
    plots = training_curves(run_dir, out) + best_of_n_curve(run_dir, out)

    lines = [f"# SWEET-RL run report: `{run_dir}`", ""]
    data = markers.get("data", {}).get("summary", {})
    if "ask domain" in str(data.get("source", "")):
        lines += ["**SYNTHETIC tasks, not ColBench**: the ask domain, in which only the simulated human knows the "
                  "constant the answer needs and tells it when asked for it. The numbers below are a toy-scale check, "
                  "not the paper's benchmark.", ""]
    elif "design domain" in str(data.get("source", "")):
        lines += ["**SYNTHETIC tasks, not ColBench**: the design domain, in which only the simulated human, a "
                  "deterministic describer of screenshot differences, knows the target page's colours and layout and "
                  "tells them when shown a page. The numbers below are a toy-scale check, not the paper's benchmark.",
                  ""]
    elif "testbed domain" in str(data.get("source", "")):
        lines += ["**SYNTHETIC tasks, not ColBench**: the credit-assignment testbed, in which the agent asks a "
                  "scripted human about the hidden terms of a polynomial, with a request that cues them imperfectly "
                  "and two questions before it must answer. Every turn's true value is known, so the judges and the "
                  "policies are measured against the ground truth below. A toy-scale check, not the paper's "
                  "benchmark.", ""]
    elif "SYNTHETIC" in str(data.get("source", "")):
        lines += ["**SYNTHETIC data, not ColBench**: scripted collaborations in which only the hidden reference code "
                  "holds the constant the answer needs. The numbers below are a toy-scale check, not the paper's "
                  "benchmark.", ""]
    if _is_frontend(run_dir):
        return _write_frontend_report(run_dir, out, markers, lines, plots)
    ask = "ask domain" in str(data.get("source", ""))
    extra = " opens with the good question |" if ask else ""
    lines += ["## Results on the test tasks", "",
              "| method | % tests passed | success rate | 95% CI (success) | trajectories |" + extra,
              "|---|---|---|---|---|" + "---|" * ask]
    evaluated = [(stage, name) for stage, name in _methods([run_dir]).items() if stage in markers]
    for stage, name in evaluated:
        s = markers[stage]["summary"]
        n, k = s["trajectories"], round(s["success"] * s["trajectories"])
        lo, hi = wilson(k, n)
        cell = ""
        if ask:  # the first turn decides an ask-domain episode: how often the policy opens with the right question
            good = _first_turns(RunLayout(run_dir).episodes(stage)).get(None)
            cell = " - |" if good is None else f" {100 * good:.0f}% |"
        lines.append(f"| {name} | {100 * s['tests_passed']:.1f} | {100 * s['success']:.1f} | "
                     f"{100 * lo:.1f}-{100 * hi:.1f} | {n} |" + cell)
    if not evaluated:
        lines.append("| (no evaluation stage has finished) | | | | |")
    lines += _training_table(markers)
    bon = RunLayout(run_dir).best_of_n
    lines += best_of_n_section(bon)
    if ask and os.path.exists(bon):
        curves, _ = read_best_of_n(bon)
        n_max = max((n for points in curves.values() for n in points), key=int)
        cells = []
        by_selector = _first_turns(bon + ".trajectories.jsonl", lambda r: (r["selector"], str(r["n"])))
        for sel in curves:
            good = by_selector.get((sel, n_max))
            cells.append(f"{sel} {'-' if good is None else f'{100 * good:.0f}%'}")
        lines += ["", f"Episodes that open with the good question at N={n_max}: " + ", ".join(cells) + "."]
    if ask:
        lines += ask_turns_section(run_dir, evaluated)
    if _task_type(run_dir) == "testbed":
        extra_lines, extra_plots = testbed_sections([run_dir], out)
        lines += extra_lines
        plots += extra_plots
    if against:
        lines += comparison_section(run_dir, against)
    return _finish_report(out, markers, lines, plots)


def _fine_tuning(run_dir: str) -> str:
    """How a run fine-tunes: "LoRA rank R on TARGETS" or "full fine-tuning" (its config's `lora`)."""
    lora = _run_config(run_dir).lora
    if not lora.rank:
        return "full fine-tuning"
    return f"LoRA rank {lora.rank}, alpha {lora.alpha:g} on {lora.targets}"


def comparison_section(run_dir: str, other: str) -> list[str]:
    """This run against `other`, a run of the same config and seed that fine-tunes differently (LoRA against full
    fine-tuning): every evaluated method's success in both, and the difference over the episodes both played (the
    same task, its k-th rollout) with a 95% bootstrap interval over them (`reporting.paired_stats`); then the training
    stages' held-out accuracy side by side."""
    from sweet_jax.reporting.paired_stats import paired_difference

    other = os.path.abspath(other)
    if not os.path.isdir(other):
        raise FileNotFoundError(f"{other}: no such run to compare with (lora.compare_with)")
    lines = ["", f"## Against `{other}`", "",
             f"This run: {_fine_tuning(run_dir)}. That run: {_fine_tuning(other)}. Difference: this run's success "
             f"minus that run's, in points, over the episodes both played.", "",
             "| method | this run | that run | difference | 95% CI | paired episodes |", "|---|---|---|---|---|---|"]
    for stage, name in _methods([run_dir]).items():
        paths = [RunLayout(d).episodes(stage) for d in (run_dir, other)]
        if not all(os.path.exists(p) for p in paths):
            continue
        a, b = ({(0, *k): v for k, v in _episode_success(p).items()} for p in paths)
        if not set(a) & set(b):
            continue
        r = paired_difference(a, b)
        lines.append(f"| {name} | {100 * sum(a.values()) / len(a):.1f} | {100 * sum(b.values()) / len(b):.1f} | "
                     f"{100 * r['difference']:+.1f} | {100 * r['low']:+.1f} to {100 * r['high']:+.1f} | "
                     f"{r['episodes']} |")
    mine, theirs = _markers(run_dir), _markers(other)
    lines += ["", "| training stage | held-out accuracy, this run | that run | seconds, this run | that run |",
              "|---|---|---|---|---|"]
    for stage in TRAINING:
        if stage in mine and stage in theirs and "held_out" in mine[stage]["summary"]:
            x, y = mine[stage]["summary"], theirs[stage]["summary"]
            acc = [s["held_out"].get("accuracy") for s in (x, y)]
            lines.append(f"| {stage} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in acc)
                         + f" | {x['seconds']} | {y['seconds']} |")
    return lines


def ask_turns_section(run_dir: str, evaluated: list[tuple[str, str]]) -> list[str]:
    """The ask domain turn by turn, per evaluated method and per best-of-N selector at the largest N: how episodes
    open, what follows the good question (does the simulated human state the right constant, does the answer copy
    the constant it was told), and success after each opening (`colbench.synthetic.ask_breakdown`)."""
    from sweet_jax.colbench.synthetic import ask_breakdown

    rows = []
    for stage, name in evaluated:
        path = RunLayout(run_dir).episodes(stage)
        if os.path.exists(path):
            rows.append((name, read_jsonl(path)))
    bon = RunLayout(run_dir).best_of_n_episodes
    if os.path.exists(bon):
        records = read_jsonl(bon)
        n_max = max((int(r["n"]) for r in records), default=0)
        for sel in sorted({r["selector"] for r in records}):
            rows.append((f"best-of-{n_max}, {sel}", [r for r in records if r["selector"] == sel
                                                     and int(r["n"]) == n_max]))
    if not rows:
        return []
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}"  # noqa: E731
    lines = ["", "## The ask domain turn by turn", "",
             "Per method, on the test tasks: the share of episodes opening with the good question; after it, how "
             "often the simulated human's reply states the task's constant (told right), how often the answer uses "
             "the constant the reply stated (copied), and the success; then the success after the other openings.",
             "", "| method | episodes | opens good % | told right % | copied % | success after good % | "
             "success after vague % | success after answer % |", "|---|---|---|---|---|---|---|---|"]
    for name, records in rows:
        b = ask_breakdown(records)
        after = b["success_by_opening"]
        lines.append(f"| {name} | {b['episodes']} | {pct(b['openings'].get('good question', 0.0))} | "
                     f"{pct(b['told_right'])} | {pct(b['copied'])} | {pct(b['success_after_good'])} | "
                     f"{pct(after.get('vague question'))} | {pct(after.get('answer'))} |")
    return lines


def _training_table(markers: dict) -> list[str]:
    lines = ["", "## Training", "", "| stage | steps | held-out accuracy | held-out loss | seconds |",
             "|---|---|---|---|---|"]
    for stage in TRAINING:
        if stage in markers and "held_out" in markers[stage]["summary"]:
            s = markers[stage]["summary"]
            acc, loss = s["held_out"].get("accuracy"), s["held_out"].get("loss")
            lines.append(f"| {stage} | {s['steps']} | {'-' if acc is None else f'{acc:.3f}'} | "
                         f"{'-' if loss is None else f'{loss:.4f}'} | {s['seconds']} |")
    return lines


def _finish_report(out: str, markers: dict, lines: list[str], plots: list[str]) -> str:
    """The plots, the stages table, and report.md written."""
    lines += [""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    if not any(p.endswith("best_of_n.png") for p in plots):
        lines += ["", "No best-of-N evaluation in this run (`eval/best_of_n.json`), so no Figure 3a curve."]
    lines += ["", "## Stages", "", "| stage | seconds | summary |", "|---|---|---|"]
    for name, rec in markers.items():
        summary = json.dumps(rec.get("summary", {}))
        lines.append(f"| {name} | {rec.get('seconds', '')} | `{summary[:160]}{'...' if len(summary) > 160 else ''}` |")
    return write_text(report_file(out, "report.md"), "\n".join(lines) + "\n")


def _run_config(run_dir: str):
    """A pipeline run's config (its config.json, `pipeline_config.PipelineConfig`); the defaults for a run without
    one."""
    from sweet_jax.runs.pipeline_config import PipelineConfig, load_pipeline_config

    path = RunLayout(run_dir).config
    if not os.path.exists(path):
        return PipelineConfig()
    with open(path) as fh:
        return load_pipeline_config(json.load(fh), source=path)


def _task_type(run_dir: str) -> str:
    return _run_config(run_dir).task_type


def _is_frontend(run_dir: str) -> bool:
    return _task_type(run_dir) == "frontend"


def _methods(run_dirs: list[str]) -> dict[str, str]:
    """The evaluation stages of the runs' track, by the method they measure, in table order."""
    return TESTBED_METHODS if all(_task_type(d) == "testbed" for d in run_dirs) else METHODS


def _write_frontend_report(run_dir: str, out: str, markers: dict, lines: list[str], plots: list[str]) -> str:
    """The frontend results in the layout of the paper's Table 2 (similarity x100, win rate against the zero-shot
    pages, ties counting half, each with its 95% interval), the training table, and the screenshots page."""
    rows = frontend_rows([run_dir])
    lines += ["## Results on the test tasks", "",
              "Similarity of the final page's screenshot to the target's (x100; the run's metric: CLIP cosine with "
              "`collect.clip`, else the offline pixel metric), and the win rate against the zero-shot policy's pages "
              "per task (ties count half); 95% normal intervals.", ""] + FRONTEND_HEAD
    for stage, name in FRONTEND_METHODS.items():
        if stage in rows:
            lines.append(f"| {name} | " + rows[stage].cells())
    if not rows:
        lines.append("| (no evaluation stage has finished) | | | | | | |")
    lines += _training_table(markers)
    lines += best_of_n_section(RunLayout(run_dir).best_of_n)
    shots = screenshots_page(run_dir, out)
    if shots:
        lines += ["", "## Sample pages", "", "The first test tasks: the target, then each method's final page with its "
                  "similarity.", "", "![screenshots.png](screenshots.png)"]
    return _finish_report(out, markers, lines, plots)


def write_seeds_report(run_dirs: list[str], out: str) -> str:
    """`seeds.md` in `out`: the same config run with several seeds, one column per run and the pooled rate (all
    episodes of all runs together, with its 95% Wilson interval), for the policies and for best-of-N."""
    runs = [os.path.abspath(d) for d in run_dirs]
    markers = [_markers(d) for d in runs]
    for d, m in zip(runs, markers):
        if not m:
            raise FileNotFoundError(f"{d}: no finished pipeline stages (stages/*.json)")
    if all(_is_frontend(d) for d in runs):
        lines = [f"# Frontend results over {len(runs)} runs", "", "Runs: " + ", ".join(
            f"{i + 1} = `{d}`" for i, d in enumerate(runs)), "",
                 "Every test episode of every run pooled: similarity x100 and the win rate against each run's "
                 "zero-shot pages per task (ties count half), with 95% normal intervals.", ""] + FRONTEND_HEAD
        rows = frontend_rows(runs)
        lines += [f"| {name} | " + rows[stage].cells() for stage, name in FRONTEND_METHODS.items() if stage in rows]
        episodes: dict[tuple[str, int], list[float]] = {}
        for d in runs:
            path = RunLayout(d).best_of_n_episodes
            for rec in read_jsonl(path) if os.path.exists(path) else []:
                episodes.setdefault((rec["selector"], int(rec["n"])), []).append(float(rec["reward"]))
        if episodes:
            lines += ["", "## Best-of-N on the test tasks (similarity x100, every episode of every run pooled)", "",
                      "| selector | N | similarity x100 | 95% CI | episodes |", "|---|---|---|---|---|"]
            for (sel, n), values in episodes.items():
                lo, hi = normal_interval(values)
                lines.append(f"| {sel} | {n} | {100 * sum(values) / len(values):.1f} | {100 * lo:.1f}-{100 * hi:.1f} "
                             f"| {len(values)} |")
        return write_text(report_file(out, "seeds.md"), "\n".join(lines) + "\n")
    head = "| | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | pooled | 95% CI (pooled) |"
    rule = "|---|" + "---|" * (len(runs) + 2)

    def row(name: str, cells: list[tuple[int, int] | None]) -> str:
        got = [c for c in cells if c is not None]
        k, n = sum(c[0] for c in got), sum(c[1] for c in got)
        lo, hi = wilson(k, n)
        each = [f"{100 * c[0] / c[1]:.1f}" if c and c[1] else "-" for c in cells]
        pooled = f"{100 * k / n:.1f} | {100 * lo:.1f}-{100 * hi:.1f}" if n else "- | -"
        return f"| {name} | " + " | ".join(each) + f" | {pooled} |"

    lines = [f"# Success over {len(runs)} runs", "", "Runs: " + ", ".join(f"{i + 1} = `{d}`" for i, d in
                                                                            enumerate(runs)), "",
             "## Policies on the test tasks (success %)", "", head, rule]
    for stage, name in _methods(runs).items():
        cells = []
        for m in markers:
            s = m.get(stage, {}).get("summary")
            cells.append((round(s["success"] * s["trajectories"]), s["trajectories"]) if s else None)
        if any(cells):
            lines.append(row(name, cells))
    results = [read_best_of_n(RunLayout(d).best_of_n)
               if os.path.exists(RunLayout(d).best_of_n) else None for d in runs]
    if any(results):
        lines += ["", "## Best-of-N on the test tasks (success %)", "", head, rule]
        order = list(dict.fromkeys(sel for r in results if r for sel in r[0]))
        ns = sorted({n for r in results if r for points in r[0].values() for n in points}, key=int)
        for sel in order:
            for n in ns:
                cells = []
                for r in results:
                    if r is None or n not in r[0].get(sel, {}):
                        cells.append(None)
                    else:
                        count = r[1][sel][n]
                        cells.append((round(r[0][sel][n] * count), count))
                lines.append(row(f"{sel}, N={n}", cells))
    lines += paired_section(runs)
    if all(_task_type(d) == "testbed" for d in runs):
        extra_lines, extra_plots = testbed_sections(runs, out)
        lines += extra_lines + [""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in extra_plots]
    return write_text(report_file(out, "seeds.md"), "\n".join(lines) + "\n")


def _episode_success(path: str) -> dict:
    """{(task, its k-th episode in the file): 1.0 on success, else 0.0} of an evaluation's trajectory file: each
    method plays the same test tasks the same number of times, so the k-th episodes of a task are paired."""
    from sweet_jax.data.trajectories import task_key

    out, seen = {}, {}
    for rec in read_jsonl(path):
        key = task_key(rec["task"])
        seen[key] = seen.get(key, -1) + 1
        out[(key, seen[key])] = float(float(rec["reward"]) >= 1.0)
    return out


def _paired_success(runs: list[str], methods) -> dict[str, dict]:
    """{evaluation stage: {(run index, task, k): success}} over the runs, for `paired_difference`."""
    success = {stage: {} for stage in methods}
    for i, d in enumerate(runs):
        for stage in methods:
            path = RunLayout(d).episodes(stage)
            if os.path.exists(path):
                success[stage].update({(i, *k): v for k, v in _episode_success(path).items()})
    return success


def paired_section(runs: list[str]) -> list[str]:
    """SWEET-RL minus each baseline (on the testbed also each actor ablation), in success points, over the episodes
    both played in every run (the same task, its k-th rollout), with a 95% bootstrap interval over the runs (seeds)
    and the episodes (`reporting.paired_stats.paired_difference`)."""
    from sweet_jax.reporting.paired_stats import paired_difference

    methods = _methods(runs)
    success = _paired_success(runs, methods)
    rows = []
    for base in ("test_mtdpo", "test_rft", "test_zero_shot", "test_no_info", "test_sum"):
        if base in success and success["test"] and success[base] and set(success["test"]) & set(success[base]):
            r = paired_difference(success["test"], success[base])
            rows.append(f"| SWEET-RL - {methods[base]} | {100 * r['difference']:+.1f} | "
                        f"{100 * r['low']:+.1f} to {100 * r['high']:+.1f} | {r['episodes']} | {r['clusters']} |")
    if not rows:
        return []
    return ["", "## Paired differences (success points)", "",
            "Each method plays the same test tasks the same number of times in each run; the differences pair the "
            "episodes of the same task and rollout, with a 95% bootstrap interval that resamples the runs and the "
            "episodes within them.", "", "| comparison | difference | 95% CI | paired episodes | runs |",
            "|---|---|---|---|---|", *rows]


# the testbed sweep's dials: (the run config's key, how a cell directory names the dial)
SWEEP_DIALS = {"rollouts": ("data", "rollouts"), "noise": ("testbed", "outcome_noise"),
               "questions": ("testbed", "budget")}


def sweep_cells(main_runs: list[str], sweep_dir: str) -> dict[str, dict[float, list[str]]]:
    """{dial: {value: run dirs}}: each cell of the sweep (SWEEP_DIR/DIAL_VALUE/seed_S) and, at the main setting's
    value of every dial (read from its runs' configs), the main setting's runs."""
    import glob

    cells: dict[str, dict[float, list[str]]] = {dial: {} for dial in SWEEP_DIALS}
    for d in sorted(glob.glob(os.path.join(sweep_dir, "*", "seed_*"))):
        dial, _, value = os.path.basename(os.path.dirname(d)).partition("_")
        if dial in SWEEP_DIALS and os.path.exists(RunLayout(d).marker("test")):
            cells[dial].setdefault(float(value), []).append(d)
    for dial, (block, key) in SWEEP_DIALS.items():
        for d in main_runs:
            section = getattr(_run_config(d), block, None)  # a dial of another track's config: none
            value = getattr(section, key) if section is not None else None
            if value is not None:
                cells[dial].setdefault(float(value), []).append(d)
    return cells


def sweep_report(main_runs: list[str], sweep_dir: str, out: str) -> list[str]:
    """sweep.md and testbed_sweep.png in `out`: for each dial and value, SWEET-RL minus multi-turn DPO and minus RFT
    (paired, with the bootstrap interval of `paired_section`), each method's success, and the SWEET critic's rank
    correlation with Q* among question and among answer candidates under the official reference (the judges stage's
    "critic (sampler)"), the main setting's runs at its own value of every dial."""
    from sweet_jax.reporting.paired_stats import paired_difference

    cells = sweep_cells(main_runs, sweep_dir)
    lines = ["# The testbed sweep: SWEET-RL against the baselines, dial by dial", "",
             "Each cell moves one dial of the main setting; the main setting's runs stand at its own value of every "
             "dial. Differences in success points, pairing the episodes of the same task in the same run, with a 95% "
             "bootstrap interval over the runs and the episodes. The critic columns: the SWEET critic's rank "
             "correlation with Q* among a held-out state's question candidates and among its answer candidates "
             "(official reference; the mean over the runs, their range in brackets).", "",
             "| dial | value | runs | SWEET-RL - multi-turn DPO | SWEET-RL - RFT | SWEET-RL | multi-turn DPO | RFT | "
             "zero-shot | critic, questions | critic, answers |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    points = {}
    for dial, by_value in cells.items():
        for value, runs in sorted(by_value.items()):
            success = _paired_success(runs, TESTBED_METHODS)
            if not success["test"]:
                continue
            diffs = {base: paired_difference(success["test"], success[base]) if success[base] else None
                     for base in ("test_mtdpo", "test_rft")}
            rates = [f"{100 * sum(v.values()) / len(v):.1f}" if v else "-"
                     for v in (success[m] for m in ("test", "test_mtdpo", "test_rft", "test_zero_shot"))]
            gaps = [f"{100 * r['difference']:+.1f} ({100 * r['low']:+.1f} to {100 * r['high']:+.1f})" if r else "-"
                    for r in (diffs["test_mtdpo"], diffs["test_rft"])]
            critic = critic_by_kind(runs)
            lines.append(f"| {dial} | {value:g} | {len(runs)} | " + " | ".join(gaps + rates) +
                         f" | {critic['question']} | {critic['answer']} |")
            if diffs["test_mtdpo"]:
                points.setdefault(dial, []).append((value, diffs["test_mtdpo"], len(runs)))
    os.makedirs(out, exist_ok=True)
    md = report_file(out, "sweep.md")
    write_text(md, "\n".join(lines) + "\n")
    if not points:
        return [md]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(points), figsize=(4 * len(points), 3.4), sharey=True, squeeze=False)
    for ax, (dial, pts) in zip(axes[0], points.items()):
        xs = [f"{v:g}" for v, _, _ in pts]
        ys = [100 * r["difference"] for _, r, _ in pts]
        err = [[100 * (r["difference"] - r["low"]) for _, r, _ in pts],
               [100 * (r["high"] - r["difference"]) for _, r, _ in pts]]
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=4)
        for x, y, (_, _, n) in zip(xs, ys, pts):
            ax.annotate(f"{n} runs", (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel(dial)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("SWEET-RL - multi-turn DPO\n(success points, 95% CI)")
    fig.suptitle("SYNTHETIC credit-assignment testbed: SWEET-RL against multi-turn DPO by dial")
    png = report_file(out, "testbed_sweep.png")
    _save(fig, png)
    return [md, png]


@dataclasses.dataclass(frozen=True)
class ReportSettings:
    run_dir: list[str] = flag(help="a pipeline run; several (seeds of one config): also seeds.md", positional=True,
                              required=True)
    output: str | None = flag(None, help="default: RUN_DIR/report (the first run's, for seeds.md)")
    against: str | None = flag(None, help="another run of the same config and seed (e.g. full fine-tuning against "
                                          "LoRA): one run's report sets each method against it")
    sweep: str | None = flag(None, help="a testbed sweep's directory (DIAL_VALUE/seed_S): also sweep.md and "
                                        "testbed_sweep.png, the RUN_DIRs the main setting's seeds")


def write_reports(s: ReportSettings) -> list[str]:
    """Each run's report, and with several runs the pooled `seeds.md`; returns the paths written."""
    if s.against and len(s.run_dir) > 1:
        raise FileNotFoundError("--against compares one run with another: give one RUN_DIR")
    paths = [write_report(d, s.output if len(s.run_dir) == 1 else None, s.against) for d in s.run_dir]
    if len(s.run_dir) > 1:
        paths.append(write_seeds_report(s.run_dir, s.output or RunLayout(s.run_dir[0]).report))
    if s.sweep:
        paths += sweep_report(s.run_dir, s.sweep, s.output or RunLayout(s.sweep).report)
    return paths
