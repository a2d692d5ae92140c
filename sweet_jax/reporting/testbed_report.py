"""The credit-assignment testbed's part of a run's report (`reporting.run_report.write_report` on a testbed run) and of
the seeds' `seeds.md`: every judge against the ground truth (the diagnostics stage's eval/critic_diagnostics.json)
as a table and a plot (`critic_diagnostics.png`), the critics under both ranking references (the judges stage's
eval/judges.json), and every evaluated policy turn by turn against the optimum (eval/policy_diagnostics.json).
Over several seeds, each measure is the mean over the seeds with its range.
"""

from __future__ import annotations

import json
import os

from sweet_jax.files.atomic import atomic_file
from sweet_jax.runs.run_layout import RunLayout, report_file

# the evaluation stages of a testbed run, by the method they measure, in table order
TESTBED_METHODS = {"test_zero_shot": "Zero-shot", "test_rft": "Rejection fine-tuning", "test_mtdpo": "Multi-turn DPO",
                   "test_no_info": "SWEET-RL, critic w/o information", "test_sum": "SWEET-RL, summed advantage",
                   "test": "SWEET-RL"}
MEASURES = (("rank_correlation", "rank corr."), ("top1", "top-1"), ("pairwise_accuracy", "pairwise acc."))


def _read(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def _cell(values: list[float | None], scale: float = 1.0, digits: int = 2) -> str:
    """The mean over the runs that have a value, with their range when there are several."""
    got = [v * scale for v in values if v is not None]
    if not got:
        return "-"
    mean = sum(got) / len(got)
    if len(got) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(got):.{digits}f}-{max(got):.{digits}f})"


def _critics(run_dirs: list[str]) -> list[dict]:
    return [d for d in (_read(RunLayout(r).evaluation("critic_diagnostics")) for r in run_dirs) if d]


def judges_section(runs: list[dict]) -> list[str]:
    """The judges' table: per judge, against Q* and against Q under the collecting policy, the rank correlation,
    the top-1 agreement (with chance) and the pairwise accuracy; then the rank correlation against Q* by turn and
    the pairwise accuracy by action type. `runs`: each run's eval/critic_diagnostics.json."""
    if not runs:
        return []
    judges = list(dict.fromkeys(name for d in runs for name in d))
    pooled = f" (the mean over {len(runs)} runs, their range in brackets)" if len(runs) > 1 else ""
    lines = ["", "## The judges against the ground truth", "",
             "On the test tasks' states that the best-of-N episodes reached, each judge scores the initial policy's 16 "
             "candidates. Their true values are exact: Q* (the optimal continuation) and Q under the collecting "
             "policy (the data's). Rank correlation is Spearman's per state, averaged; top-1 is how often the judge's "
             "best candidate is a truly best one (chance: a random pick); pairwise accuracy is over candidate pairs "
             f"with different true values{pooled}.", "",
             "| judge | states | rank corr. (Q*) | top-1 (Q*) | top-1 chance | pairwise acc. (Q*) | rank corr. (Q^mu) "
             "| pairwise acc. (Q^mu) |", "|---|---|---|---|---|---|---|---|"]
    for name in judges:
        got = [d[name] for d in runs if name in d]
        opt, col = [g["optimal"] for g in got], [g["collector"] for g in got]
        lines.append(f"| {name} | {sum(o['states'] for o in opt)} | "
                     + " | ".join(_cell([o[k] for o in opt]) for k in ("rank_correlation", "top1", "top1_chance",
                                                                       "pairwise_accuracy"))
                     + f" | {_cell([c['rank_correlation'] for c in col])} | "
                       f"{_cell([c['pairwise_accuracy'] for c in col])} |")
    turns = sorted({t for d in runs for g in d.values() for t in g["optimal"]["by_turn"]}, key=int)
    kinds = sorted({k for d in runs for g in d.values() for k in g["optimal"]["by_kind"]})
    lines += ["", "By turn (rank correlation with Q*) and by action type (pairwise accuracy with Q* among the "
                  "candidates of one type: which question, which answer):", "",
              "| judge | " + " | ".join(f"turn {int(t) + 1}" for t in turns) + " | "
              + " | ".join(f"{k}s" for k in kinds) + " |", "|---|" + "---|" * (len(turns) + len(kinds))]
    for name in judges:
        opt = [d[name]["optimal"] for d in runs if name in d]
        lines.append(f"| {name} | "
                     + " | ".join(_cell([o["by_turn"].get(t, {}).get("rank_correlation") for o in opt])
                                  for t in turns) + " | "
                     + " | ".join(_cell([o["by_kind"].get(k, {}).get("pairwise_accuracy") for o in opt])
                                  for k in kinds) + " |")
    return lines


def judges_plot(runs: list[dict], out: str) -> list[str]:
    """critic_diagnostics.png: per judge, the three measures against Q*, each a bar (the mean over the runs, the
    runs' range as the error bar), and top-1's chance as a line."""
    if not runs:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    judges = list(dict.fromkeys(name for d in runs for name in d))
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(MEASURES)
    for i, (key, label) in enumerate(MEASURES):
        means, lows, highs = [], [], []
        for name in judges:
            vals = [d[name]["optimal"][key] for d in runs if name in d and d[name]["optimal"][key] is not None]
            m = sum(vals) / len(vals) if vals else 0.0
            means.append(m)
            lows.append(m - min(vals) if vals else 0.0)
            highs.append(max(vals) - m if vals else 0.0)
        x = [j + (i - (len(MEASURES) - 1) / 2) * width for j in range(len(judges))]
        ax.bar(x, means, width, yerr=[lows, highs] if len(runs) > 1 else None, capsize=2, label=label)
    chance = [sum(d[n]["optimal"]["top1_chance"] or 0 for d in runs if n in d) / max(sum(n in d for d in runs), 1)
              for n in judges]
    ax.scatter(range(len(judges)), chance, marker="_", s=400, color="black", zorder=3, label="top-1 chance")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(judges)), judges, rotation=20, ha="right")
    ax.set_ylim(-0.5, 1.05)
    ax.set_title("judges against Q* on held-out states" + (f" ({len(runs)} runs)" if len(runs) > 1 else ""))
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3, axis="y")
    path = report_file(out, "critic_diagnostics.png")
    with atomic_file(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [path]


def policies_section(run_dirs: list[str]) -> list[str]:
    """Each evaluated policy turn by turn against the optimum: the share of its actions that were optimal (by Q*),
    that asked about a term the task uses, that wasted a turn (a term it does not use, one already told, the vague
    question); its answers' form and copying; success after each opening; regret against the optimal policy."""
    runs = [d for d in (_read(RunLayout(r).evaluation("policy_diagnostics")) for r in run_dirs) if d]
    if not runs:
        return []
    pct = lambda values: _cell(values, 100, 0)  # noqa: E731

    def wasted(row: dict) -> float:
        return sum(row.get(k, 0.0) for k in ("ask unused", "ask told", "vague"))

    lines = ["", "## The policies against the optimum", "",
             "Per method on the test tasks (%): optimal, the share of turn t's actions among the state's best by Q*; "
             "asked used, questions about a term the task has; wasted, questions about a term it lacks or one already "
             "told, or vague ones; copied, answers with every told coefficient right; regret, V* at the first state "
             "minus the outcome (points)"
             + (f"; the mean over {len(runs)} runs, their range in brackets" if len(runs) > 1 else "") + ".", "",
             "| method | optimal t1 | optimal t2 | optimal t3 | asked used t1 | wasted t1 | wasted t2 | copied | "
             "optimal guesses | regret |", "|---|---|---|---|---|---|---|---|---|---|"]
    for stage, name in TESTBED_METHODS.items():
        got = [d[stage] for d in runs if stage in d]
        if not got:
            continue
        turn = lambda t, f: pct([f(g["by_turn"][str(t)]) if str(t) in g["by_turn"] else None  # noqa: E731
                                 for g in got])
        lines.append(f"| {name} | {turn(0, lambda r: r['optimal'])} | {turn(1, lambda r: r['optimal'])} | "
                     f"{turn(2, lambda r: r['optimal'])} | {turn(0, lambda r: r.get('ask used', 0.0))} | "
                     f"{turn(0, wasted)} | {turn(1, wasted)} | {pct([g['answers']['told_right'] for g in got])} | "
                     f"{pct([g['answers']['guesses_optimal'] for g in got])} | {pct([g['regret'] for g in got])} |")
    openings = sorted({k for d in runs for g in d.values() for k in g["success_by_opening"]})
    lines += ["", "Openings (share of episodes %, then success after it %):", "",
              "| method | " + " | ".join(openings) + " |", "|---|" + "---|" * len(openings)]
    for stage, name in TESTBED_METHODS.items():
        got = [d[stage] for d in runs if stage in d]
        if got:
            cells = []
            for k in openings:
                share = pct([g["success_by_opening"].get(k, {}).get("share", 0.0) for g in got])
                success = pct([g["success_by_opening"].get(k, {}).get("success") for g in got])
                cells.append(f"{share} / {success}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _judged_runs(run_dirs: list[str]) -> list[dict]:
    """The runs' eval/judges.json (the judges stage's), those that have one."""
    return [d for d in (_read(RunLayout(r).evaluation("judges")) for r in run_dirs) if d]


def _by_kind(judged: dict, kind: str, measure: str) -> float | None:
    """A judge's `measure` against Q* among the candidates of one kind ("question", "answer") of a state."""
    return judged["optimal"]["by_kind"].get(kind, {}).get(measure)


def references_section(run_dirs: list[str]) -> list[str]:
    """The critics under both ranking references (eval/judges.json): against Q*, the rank correlation among the
    question candidates and among the answer candidates of a state, the pairwise accuracy among answers, and the
    overall rank correlation against Q* and against Q under the collecting policy."""
    runs = _judged_runs(run_dirs)
    if not runs:
        return []
    names = list(dict.fromkeys(name for d in runs for name in d["judges"]))
    lines = ["", "## The critics under both ranking references", "",
             "Held-out states (one collecting-policy episode per test task), 16 candidates of the initial policy each. "
             "A critic's score is its mean log-prob of the candidate minus the reference's: the sampler's without "
             "the information (the official code), or the frozen base on the critic's own text (the paper's Eq. 3). "
             "`base` is the untrained base as the critic."
             + (f" The mean over {len(runs)} runs, their range in brackets." if len(runs) > 1 else ""), "",
             "| critic (reference) | rank corr. questions | rank corr. answers | pairwise acc. answers | rank corr. "
             "(Q*) | rank corr. (Q^mu) |", "|---|---|---|---|---|---|"]
    for name in names:
        got = [d["judges"][name] for d in runs if name in d["judges"]]
        lines.append(f"| {name} | {_cell([_by_kind(g, 'question', 'rank_correlation') for g in got])} | "
                     f"{_cell([_by_kind(g, 'answer', 'rank_correlation') for g in got])} | "
                     f"{_cell([_by_kind(g, 'answer', 'pairwise_accuracy') for g in got])} | "
                     f"{_cell([g['optimal']['rank_correlation'] for g in got])} | "
                     f"{_cell([g['collector']['rank_correlation'] for g in got])} |")
    return lines


def critic_by_kind(run_dirs: list[str], name: str = "critic (sampler)") -> dict[str, str]:
    """{"question": cell, "answer": cell}: judge `name`'s rank correlation with Q* among a state's question
    candidates and among its answer candidates (eval/judges.json), the mean over the runs that have it with their
    range; "-" where none has."""
    got = [d["judges"][name] for d in _judged_runs(run_dirs) if name in d["judges"]]
    return {kind: _cell([_by_kind(g, kind, "rank_correlation") for g in got]) for kind in ("question", "answer")}


def testbed_sections(run_dirs: list[str], out: str) -> tuple[list[str], list[str]]:
    """(the report's lines, the plots written to `out`) for testbed runs: the judges, the critics under both
    references and the policies."""
    critics = _critics(run_dirs)
    return (judges_section(critics) + references_section(run_dirs) + policies_section(run_dirs),
            judges_plot(critics, out))
