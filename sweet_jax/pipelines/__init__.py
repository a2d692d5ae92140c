"""SWEET-RL end to end (`python -m sweet_jax.pipeline`): the stage runner (stage_runner), the stages every track
shares (shared_stages), one module per track (backend_stages, frontend_stages, testbed_stages), and the track a run's
`task_type` picks (stages)."""
