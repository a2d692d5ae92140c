"""A pipeline run: its typed config (pipeline_config, one schema per track) and where each of its files lies
(run_layout), shared by the pipeline's stages and the reports."""
