"""What some tests need from the machine, as skip markers that say what is missing and how to get it
(`bash launch/setup.sh` installs all of it)."""

import os
import shutil

import pytest

from sweet_jax.colbench.render import TAILWIND_SHA256, default_tailwind_css, find_chromium

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLBENCH = os.path.join(ROOT, "..", "shared", "colbench")


def _tailwind_ok() -> bool:
    import hashlib

    path = default_tailwind_css()
    return os.path.exists(path) and hashlib.sha256(open(path, "rb").read()).hexdigest() == TAILWIND_SHA256


def renderer_missing() -> str | None:
    """Why pages cannot be rendered here, or None."""
    if not find_chromium():
        return "Chromium not installed (apt-get install chromium, or launch/setup.sh)"
    if not _tailwind_ok():
        return f"Tailwind's CSS not at {default_tailwind_css()} (launch/setup.sh fetches it with npm pack)"
    return None


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap not installed (apt-get install bubblewrap, or launch/setup.sh)")
needs_renderer = pytest.mark.skipif(renderer_missing() is not None, reason=str(renderer_missing()))


def colbench_file(name: str) -> str:
    """The path of a real ColBench test set in ../shared/colbench/, or a skip when it is not there."""
    path = os.path.join(COLBENCH, name)
    if not os.path.exists(path):
        pytest.skip(f"the ColBench test set {name} is not at ../shared/colbench/")
    return path
