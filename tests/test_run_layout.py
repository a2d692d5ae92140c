"""The run directory's map (`runs.run_layout`): the paths the stages declare relative to a run are the ones its
layout gives, the listings read what the stages leave, and every track's declared files are the layout's."""

import os
import time

from sweet_jax.pipelines.stages import TRACKS
from sweet_jax.runs.run_layout import RELATIVE, RunLayout


def _paths(layout: RunLayout) -> dict[str, str]:
    """One of each kind of path a layout gives."""
    return {"config": layout.config, "logs": layout.logs, "jax_cache": layout.jax_cache,
            "tasks": layout.tasks("train_tasks"), "task_dir": layout.task_dir, "data": layout.data("critic_pairs"),
            "data_dir": layout.data_dir, "trajectories": layout.trajectories,
            "trajectory_screenshots": layout.trajectory_screenshots, "gate": layout.gate("gate_q2.json"),
            "stage_dir": layout.stage_dir("critic"), "markers": layout.markers, "marker": layout.marker("critic"),
            "log": layout.log("critic"), "training_log": layout.training_log("critic"),
            "export": layout.export("critic"), "metrics": layout.metrics("critic"),
            "candidates": layout.candidates("ranked"), "episodes": layout.episodes("test"),
            "screenshots": layout.screenshots("test"), "screenshot": layout.screenshot("test", "ab12"),
            "best_of_n": layout.best_of_n, "best_of_n_episodes": layout.best_of_n_episodes,
            "best_of_n_states": layout.best_of_n_states, "evaluations": layout.evaluations,
            "evaluation": layout.evaluation("judges"), "report": layout.report, "report_page": layout.report_page}


def test_relative_paths_resolve_to_the_run_directory_paths(tmp_path):
    run = RunLayout(str(tmp_path / "run"))
    relative, absolute = _paths(RELATIVE), _paths(run)
    for name, path in relative.items():
        assert not os.path.isabs(path) and not path.startswith(".."), (name, path)
        assert run.path(path) == absolute[name], name
    assert relative["export"] == "critic/hf" and relative["episodes"] == "eval/test_trajectories.jsonl"
    assert relative["trajectories"] == "data/train_trajectories.jsonl"
    assert relative["best_of_n_states"] == "eval/best_of_n.json.states.jsonl"


def test_every_declared_stage_file_lies_where_the_layout_says():
    """A stage's declared inputs and outputs are files the layout names: a stage's export, an evaluation's
    episodes or figures, candidates, tasks, data, the report."""
    named = {"tasks", "data", "bon", "eval", "report"}
    for track, stages in TRACKS.items():
        for stage in stages:
            for path in (*stage.inputs, *stage.outputs):
                head, _, rest = path.partition("/")
                assert head in named or path == RELATIVE.export(head), (track, stage.name, path)
                if head == "eval":
                    assert path == RELATIVE.evaluation(rest[:-len(".json")]) or (
                        path == RELATIVE.episodes(rest[:-len("_trajectories.jsonl")])), (track, stage.name, path)


def test_the_listings_read_markers_by_finish_time_and_episodes_by_name(tmp_path):
    run = RunLayout(str(tmp_path))
    assert run.finished() == [] and run.evaluated() == []  # no directories yet
    os.makedirs(run.markers)
    for i, name in enumerate(("rank", "critic", "data")):
        with open(run.marker(name), "w") as fh:
            fh.write("{}")
        os.utime(run.marker(name), (time.time() - 100 + i, time.time() - 100 + i))
    with open(os.path.join(run.markers, "notes.txt"), "w") as fh:
        fh.write("not a marker")
    assert run.finished() == ["rank", "critic", "data"]
    os.makedirs(run.evaluations)
    for path in (run.episodes("test_mtdpo"), run.episodes("test"), run.episodes("test_zero_shot"), run.best_of_n,
                 run.best_of_n_states, run.evaluation("judges")):
        open(path, "w").close()
    # in the order of the files' names ("test_mtdpo_..." before "test_trajectories"), as the diagnostics write them
    assert run.evaluated() == ["test_mtdpo", "test", "test_zero_shot"]
