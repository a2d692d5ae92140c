"""Frontend rendering time: real ColBench target pages, offline, full-page screenshots (target: <= 1 s per page).

Our renderer (`sweet_jax.colbench.render.Renderer`) keeps one Chromium and one page alive on its own thread. The
official evaluator's Selenium + headless Firefox cannot run here (no geckodriver, and it fetches Tailwind and images
from the network). So the side-by-side baseline is the same offline rendering with a fresh browser per page, as a
script without a persistent browser would do it.

    python bench/render.py                # 100 pages, baseline on the first 10
    python bench/render.py --pages 20 --baseline-pages 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=os.path.join(ROOT, "..", "shared", "colbench", "frontend_test.jsonl"))
    p.add_argument("--pages", type=int, default=100)
    p.add_argument("--baseline-pages", type=int, default=10)
    args = p.parse_args(argv)

    from sweet_jax.colbench.render import Renderer
    from sweet_jax.colbench.task_sets import load_tasks

    tasks = load_tasks(args.tasks, "frontend", limit=args.pages)
    out = tempfile.mkdtemp(prefix="render-bench-")
    t0 = time.perf_counter()
    renderer = Renderer()
    startup = time.perf_counter() - t0
    times, failed = [], 0
    for i, task in enumerate(tasks):
        t = time.perf_counter()
        failed += renderer.render(task["ground_truth"], os.path.join(out, f"{i}.png")) is None
        times.append(time.perf_counter() - t)
    renderer.close()

    fresh = []
    for i, task in enumerate(tasks[:args.baseline_pages]):
        t = time.perf_counter()
        with Renderer() as r:
            r.render(task["ground_truth"], os.path.join(out, f"fresh{i}.png"))
        fresh.append(time.perf_counter() - t)

    mean, p95 = statistics.mean(times), sorted(times)[int(0.95 * (len(times) - 1))]
    print(f"pages: {len(tasks)} real ColBench targets, {failed} failed; browser start {startup:.2f} s (once)")
    print(f"sweet_jax renderer: mean {mean * 1e3:.0f} ms, p95 {p95 * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms per "
          f"page (target <= 1000 ms: {'PASS' if max(times) <= 1.0 else 'FAIL'})")
    base = statistics.mean(fresh)
    print(f"baseline, a fresh browser per page ({len(fresh)} pages): mean {base * 1e3:.0f} ms; "
          f"ratio baseline / ours: {base / statistics.mean(times[:len(fresh)]):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
