"""The XLA:CPU emitters the suite's own processes compile with: the pytest processes (`conftest.py`) and the snippets
they run on fake devices (`multidevice.run_with_devices`) use the older ones where this environment's XLA still has
them, so that their many one-off compiles are cheap; the commands under test (jobs, servers, pipelines) keep XLA's
default, the newer ones, whose steps run faster."""

import os

OLDER = "--xla_cpu_use_fusion_emitters=false"


def older_known() -> bool:
    """Whether this environment's XLA still has the older XLA:CPU emitters: jax 0.11's stops the process on the flag
    ("Unknown flag in XLA_FLAGS")."""
    from importlib.metadata import version

    return tuple(int(x) for x in version("jax").split(".")[:2]) < (0, 11)


def wanted() -> bool:
    """Older emitters for the suite's own processes, unless SWEET_JAX_TEST_EMITTERS=newer (to compare the two)."""
    return older_known() and os.environ.get("SWEET_JAX_TEST_EMITTERS", "older") == "older"
