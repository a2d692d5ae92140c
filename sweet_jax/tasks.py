"""ColBench task tools: `python -m sweet_jax.tasks generate --source EXCERPTS --output TASKS.jsonl --model M ...`.

generate: new backend tasks written by an LLM from web-text excerpts, each kept only if its ground truth passes its
own tests in the sandbox (see `sweet_jax.colbench.generate`). EXCERPTS is a JSONL file whose records hold the text in
`--text-field` (default "text", as in DCLM), or a plain-text file with one excerpt per line. Resumable: rerun the same
command after a crash. Prints {"kept", "rejected", "skipped_done"}.
"""

from __future__ import annotations

import argparse
import json
import sys


def _excerpts(path: str, field: str, limit: int | None, max_chars: int) -> list[str]:
    from sweet_jax.colbench.jsonl import parse_object
    from sweet_jax.data.trajectories import DataError

    out = []
    try:
        fh = open(path, encoding="utf-8")
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            if path.endswith((".jsonl", ".json")):
                rec = parse_object(line, f"{path}:{lineno}")
                if not isinstance(rec.get(field), str):
                    raise DataError(f"{path}:{lineno}: field '{field}': missing or not a string")
                text = rec[field]
            else:
                text = line.strip()
            out.append(text[:max_chars])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweet_jax.tasks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write new backend tasks with an LLM")
    g.add_argument("--source", required=True, help="web-text excerpts: JSONL (see --text-field) or plain text lines")
    g.add_argument("--output", required=True)
    g.add_argument("--text-field", default="text")
    g.add_argument("--limit", type=int, default=None, help="use the first N excerpts")
    g.add_argument("--max-chars", type=int, default=4000, help="excerpts are cut to this length")
    g.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    g.add_argument("--model", required=True, help="e.g. meta-llama/Llama-3.1-70B-Instruct (the paper's generator)")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY")
    g.add_argument("--concurrency", type=int, default=16)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--max-tokens", type=int, default=2048)
    g.add_argument("--request-timeout", type=float, default=300.0)
    args = p.parse_args(argv)

    from sweet_jax.colbench.client import LLMClient
    from sweet_jax.colbench.generate import generate
    from sweet_jax.colbench.sandbox import SandboxUnavailable
    from sweet_jax.data.trajectories import DataError

    try:
        excerpts = _excerpts(args.source, args.text_field, args.limit, args.max_chars)
        client = LLMClient(args.base_url, args.model, api_key_env=args.api_key_env, concurrency=args.concurrency,
                           timeout=args.request_timeout)
        counts = generate(excerpts, args.output, client, concurrency=args.concurrency,
                          temperature=args.temperature, max_tokens=args.max_tokens)
    except (DataError, SandboxUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
