"""The mtdpo baseline on Llama-3.1-70B-Instruct (Table 4); see mtdpo_8b.py."""

import importlib.util
import os


def get_config():
    spec = importlib.util.spec_from_file_location("mtdpo_8b", os.path.join(os.path.dirname(__file__), "mtdpo_8b.py"))
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    c = base.get_config()
    c.model.hf_path = "checkpoints/Llama-3.1-70B-Instruct"
    c.model.remat_policy = "full"
    c.train.output_dir = "runs/mtdpo_70b"
    return c
