"""New backend tasks written by an LLM, following the published recipe (`python -m sweet_jax.tasks generate`).
Imports no JAX.

For each web-text excerpt (the paper used DCLM), an LLM behind an OpenAI-compatible endpoint is asked for a JSON
object with `thought`, `ground_truth` (a Python function), `problem_description` (a vague, personal request that
leaves out details only the asker knows) and `test_cases` (10 call expressions). A task is kept only if its ground
truth passes its own tests in the sandbox, under the official scoring semantics: every call runs, returns something
other than None, and returns the same value twice. Kept tasks have the official layout, with `hidden_information`
equal to `ground_truth`. The description ends with "The signature of the function is: def name(args)".

The job is resumable like collection. Kept tasks are appended to OUTPUT and rejections, with their reason, to
OUTPUT.rejected (append-only `files.partial.PartialFile`s). Both are keyed by `source_index`, so a rerun skips
excerpts that are already done. `TaskGenerationSettings` is the command's flags.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import re

from sweet_jax.cli.app import flag
from sweet_jax.colbench.client import LLMClient
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import parse_object
from sweet_jax.files.partial import PartialFile

GENERATION_PROMPT = """\
Below is an excerpt of a web page. Imagine a person connected to it who needs a small Python function for their own, \
specific purpose, and write the programming task they would bring to an assistant.

Excerpt:
{excerpt}

Reply with one JSON object and nothing else, with these keys:
- "thought": how you got from the excerpt to the task, in a few sentences.
- "ground_truth": the exact Python function the person has in mind, with any imports inside the function body. It \
must be deterministic (no randomness, no clock, no files or network) and return a value (never None).
- "problem_description": the person's request in their own words. Keep it vague: leave out the details only they \
know (exact rules, thresholds, formats, edge cases), which an assistant would have to ask about. Do not include code.
- "test_cases": an object with exactly 10 entries "test1" ... "test10", each a Python call expression of the \
function with literal arguments, such as "f([1, 2], 3)", covering ordinary and edge cases."""

SIGNATURE_SENTENCE = "The signature of the function is: "


class Rejected(ValueError):
    """A generated task that is not kept; the message is the reason."""


def signature(code: str) -> str:
    """"def name(args)" of the first top-level function of `code`."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise Rejected(f"ground_truth does not parse: {e.msg} (line {e.lineno})") from None
    funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not funcs:
        raise Rejected("ground_truth defines no top-level function")
    f = funcs[0]
    return f"def {f.name}({ast.unparse(f.args)})"


def parse_reply(text: str) -> dict:
    """The task from an LLM reply (the first JSON object in it), in the official layout; Rejected if malformed."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise Rejected("no JSON object in the reply")
    try:
        obj = json.loads(text[start:end + 1])
    except json.JSONDecodeError as e:
        raise Rejected(f"invalid JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise Rejected("the JSON is not an object")
    code, desc, tests = obj.get("ground_truth"), obj.get("problem_description"), obj.get("test_cases")
    if not isinstance(code, str) or not code.strip():
        raise Rejected("missing ground_truth")
    if not isinstance(desc, str) or not desc.strip():
        raise Rejected("missing problem_description")
    if isinstance(tests, list):
        tests = {f"test{i + 1}": t for i, t in enumerate(tests)}
    if not isinstance(tests, dict) or len(tests) != 10 or not all(isinstance(t, str) and t.strip()
                                                                  for t in tests.values()):
        raise Rejected("test_cases must be 10 call-expression strings")
    desc = re.sub(r"\s*The signature of the function is:.*$", "", desc.strip(), flags=re.DOTALL)
    desc = desc.rstrip() + SIGNATURE_SENTENCE + signature(code)  # glued with no space, as in the released tasks
    return {"problem_description": desc, "ground_truth": code, "test_cases": {f"test{i + 1}": t for i, t in
                                                                            enumerate(tests.values())},
            "hidden_information": code}


def check_task(task: dict, evaluator) -> None:
    """Rejected unless the ground truth passes its own tests in the sandbox (twice, so nondeterminism shows)."""
    result = evaluator.score(task["ground_truth"], task["ground_truth"], task["test_cases"])
    if result.vetoed:
        raise Rejected("ground_truth contains a vetoed keyword (official scoring would give 0)")
    if not result.success:
        failed = [name for name, ok in result.tests.items() if not ok]
        raise Rejected(f"ground_truth fails its own tests {failed} (an error, None, or a different value on a rerun)")


async def _generate(excerpts, todo, client: LLMClient, evaluator, output: PartialFile, rejected: PartialFile,
                    concurrency: int, temperature: float, max_tokens: int, progress: bool) -> dict:
    from tqdm.auto import tqdm

    counts = {"kept": 0, "rejected": 0}
    queue = list(reversed(todo))
    loop = asyncio.get_running_loop()
    bar = tqdm(total=len(todo), desc="generate tasks", disable=not progress or None)

    async def worker():
        while queue:
            i = queue.pop()
            try:
                reply = await client.chat([{"role": "user", "content": GENERATION_PROMPT.format(excerpt=excerpts[i])}],
                                          temperature=temperature, max_tokens=max_tokens)
                task = parse_reply(reply)
                await loop.run_in_executor(None, check_task, task, evaluator)
                output.append({**task, "source_index": i})
                counts["kept"] += 1
            except Rejected as e:
                rejected.append({"source_index": i, "reason": str(e)})
                counts["rejected"] += 1
            bar.update(1)
            bar.set_postfix(kept=counts["kept"], rejected=counts["rejected"])

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(todo))))))
    finally:
        bar.close()
        await client.close()
    return counts


def generate(excerpts: list[str], output: str, client: LLMClient, *, concurrency: int = 16,
             temperature: float = 1.0, max_tokens: int = 2048, progress: bool = True) -> dict:
    """Write kept tasks to `output` and rejections to `output`.rejected; resumable. Returns counts."""
    from sweet_jax.colbench.backend_eval import BackendEvaluator

    def key(rec: dict) -> int:
        return int(rec["source_index"])

    with PartialFile(output, key, suffix="", what="a generated task (source_index)") as kept, \
            PartialFile(output, key, suffix=".rejected", what="a rejected excerpt (source_index)") as rejected:
        done = kept.done.keys() | rejected.done.keys()
        todo = [i for i in range(len(excerpts)) if i not in done]
        counts = asyncio.run(_generate(excerpts, todo, client, BackendEvaluator("reference"), kept, rejected,
                                       concurrency, temperature, max_tokens, progress)) if todo else \
            {"kept": 0, "rejected": 0}
    return {**counts, "skipped_done": len(done)}


@dataclasses.dataclass(frozen=True)
class TaskGenerationSettings:
    source: str = flag(help="web-text excerpts: JSONL (see --text_field) or plain text, one excerpt a line",
                       required=True)
    output: str = flag(help="the kept tasks, JSONL (rejections go to OUTPUT.rejected)", required=True)
    model: str = flag(help="the generator's served name, e.g. the paper's 70B instruct model", required=True)
    text_field: str = flag("text", help="the JSONL field holding the excerpt (as in DCLM)")
    limit: int | None = flag(None, help="use the first N excerpts")
    max_chars: int = flag(4000, help="excerpts are cut to this length")
    base_url: str = flag("http://127.0.0.1:8000/v1", help="the OpenAI-compatible endpoint")
    api_key_env: str = flag("OPENAI_API_KEY", help="the environment variable holding the API key")
    concurrency: int = flag(16, help="requests in flight, at most")
    temperature: float = flag(1.0, help="the generator's sampling temperature")
    max_tokens: int = flag(2048, help="tokens per reply, at most")
    request_timeout: float = flag(300.0, help="seconds per request attempt")


def read_excerpts(path: str, field: str, limit: int | None, max_chars: int) -> list[str]:
    """The excerpts of a JSONL file (the string field `field` of each record) or of a plain-text file (one per
    non-empty line), each cut to `max_chars`."""
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


def generate_tasks(s: TaskGenerationSettings) -> dict:
    """Read the excerpts and run `generate` against the endpoint; returns {"kept", "rejected", "skipped_done"}."""
    excerpts = read_excerpts(s.source, s.text_field, s.limit, s.max_chars)
    client = LLMClient(s.base_url, s.model, api_key_env=s.api_key_env, concurrency=s.concurrency,
                       timeout=s.request_timeout)
    return generate(excerpts, s.output, client, concurrency=s.concurrency, temperature=s.temperature,
                    max_tokens=s.max_tokens)
