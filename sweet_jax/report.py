"""A pipeline run's report: `python -m sweet_jax.report RUN_DIR [--output DIR]` writes `report.md` with the results
tables and PNG plots into RUN_DIR/report; `python -m sweet_jax.report RUN_1 RUN_2 ...` (one config, several seeds)
writes each run's report and `seeds.md` with the runs pooled. Prints the paths written; exit 2 when a run has no
finished stages. See `sweet_jax.reporting.run_report`.
"""

from sweet_jax.cli.app import run
from sweet_jax.reporting.run_report import ReportSettings, write_reports


def main(settings: ReportSettings) -> int:
    print("\n".join(write_reports(settings)))
    return 0


if __name__ == "__main__":
    run(main, ReportSettings, errors=(FileNotFoundError,))
