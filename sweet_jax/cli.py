"""What the command-line entry points (`sweet_jax.train`, `sweet_jax.plan`) share."""

from __future__ import annotations

import logging
import sys

from absl import flags

QUIET_LOGGERS = ("absl", "jax", "orbax", "datasets", "httpx", "httpx2", "openai", "filelock")


def setup_logging() -> None:
    """INFO logs on stderr with timestamps; the chatty libraries at WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr, force=True)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, with a one-line error (no traceback) for a bad override such as a misspelt config key.
    Flag names may be spelt with dashes (`--hbm-gib 80` is `--hbm_gib 80`)."""
    argv = [argv[0]] + [_underscored(a) for a in argv[1:]]
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        msg = str(e.args[0] if isinstance(e, AttributeError) and e.args else e)
        if isinstance(e, AttributeError):  # ml_collections: "'key'\nDid you mean ...", wrapped in a repr
            msg = msg.strip("'").replace("\\n", " ").replace("\\'", "'")
        msg = " ".join(msg.split())
        print(f"error: bad command line: {msg}", file=sys.stderr)
        sys.exit(2)


def _underscored(arg: str) -> str:
    if not arg.startswith("--") or arg.startswith("--config"):
        return arg
    name, eq, value = arg[2:].partition("=")
    return "--" + name.replace("-", "_") + eq + value
