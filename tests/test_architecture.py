"""The layout rules of docs/architecture.md, checked on the source: the package's top level holds commands only, no
two modules share a name, imports point one way through the layers, `colbench/` (and everything it imports) is free
of JAX, only `models/` and `chat/` name the Llama family in code, and no function is longer than a screen."""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "sweet_jax")

# Lowest first. A module may import its own package and the packages of lower layers, never a package of its own
# layer or a higher one. The commands (top-level modules) are the top layer.
LAYERS = (
    ("files", "cli"),
    ("chat", "parallel"),
    ("data", "models"),
    ("colbench", "objectives"),
    ("training", "inference"),
    ("ranking", "runs"),
    ("reporting",),
    ("pipelines",),
)
COMMANDS = ("best_of_n", "collect", "config", "describer", "evaluate", "evaluate_model", "import_gguf", "pipeline", "plan",
            "random_init", "report", "serve", "tasks", "testbed", "train")
JAX_ROOTS = ("jax", "jaxlib", "flax", "optax", "orbax")


def _modules() -> dict[str, str]:
    """{dotted module name: file path} of every module of the package."""
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


MODULES = _modules()


def _imports(path: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, module level or inside functions. `from a import b`
    counts as importing a.b when that is a module, else a."""
    tree = ast.parse(open(path).read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.append((full if full in MODULES else node.module, node.lineno))
    return out


def _package(module: str) -> str:
    """sweet_jax.models.llama -> "models"; a top-level module -> its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int:
    pkg = _package(module)
    if module.count(".") == 1 and pkg in COMMANDS:
        return len(LAYERS)
    for i, names in enumerate(LAYERS):
        if pkg in names:
            return i
    raise AssertionError(f"{module}: package {pkg!r} is in no layer of LAYERS (add it, and to docs/architecture.md)")


def test_the_top_level_holds_commands_only():
    top = sorted(m.split(".")[1] for m in MODULES
                 if m.count(".") == 1 and not os.path.isdir(os.path.join(PKG, m.split(".")[1])))
    assert top == sorted(COMMANDS)
    for name in COMMANDS:
        src = open(os.path.join(PKG, f"{name}.py")).read()
        assert 'if __name__ == "__main__":' in src, f"sweet_jax/{name}.py is not a command"
        assert "cli.app import" in src, f"sweet_jax/{name}.py does not use the one CLI stack (sweet_jax.cli.app)"
        assert len(src.splitlines()) < 120, f"sweet_jax/{name}.py is no thin main ({len(src.splitlines())} lines)"


def test_no_two_modules_share_a_name():
    seen: dict[str, str] = {}
    for module in MODULES:
        base = module.split(".")[-1]
        if module == "sweet_jax" or os.path.basename(MODULES[module]) == "__init__.py":
            continue
        assert base not in seen, f"{module} and {seen[base]} share the name {base!r}"
        seen[base] = module


def test_imports_point_down_the_layers_and_have_no_cycle():
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if module == "sweet_jax":
            continue
        graph[module] = set()
        for target, line in _imports(path):
            if not target.startswith("sweet_jax.") or target not in MODULES or target == "sweet_jax":
                continue
            graph[module].add(target)
            if _package(target) == _package(module) and _layer(module) < len(LAYERS):
                continue  # within a library package
            assert _layer(target) < _layer(module), (
                f"{path}:{line}: {module} (layer {_layer(module)}) imports {target} (layer {_layer(target)}): "
                f"imports must point to a lower layer (tests/test_architecture.py LAYERS)")
    # no cycle among the modules (within a package, where the layers allow imports both ways)
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for t in graph.get(m, ()):
            if os.path.basename(MODULES[t]) == "__init__.py":
                continue  # a package's __init__ re-exports its modules
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(t):] + [t]))
            if t not in state:
                visit(t, trail + [t])
        state[m] = 2

    for m in graph:
        if m not in state and os.path.basename(MODULES[m]) != "__init__.py":
            visit(m, [m])


def test_colbench_and_what_it_imports_are_free_of_jax():
    todo = [m for m in MODULES if _package(m) == "colbench"]
    seen = set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for target, line in _imports(MODULES[m]):
            assert target.split(".")[0] not in JAX_ROOTS, f"{MODULES[m]}:{line}: {m} imports {target}"
            if target in MODULES:
                todo.append(target)
    assert "sweet_jax.chat" in seen and "sweet_jax.files.partial" in seen  # the walk did follow the imports


LLAMA_CODE = re.compile(r"\bLlama\w*(Config|Format)\b|\bLLAMA\w*|\bllama3_tokenizer|models\.llama\b|"
                        r"models import llama\b|chat\.llama3\b|chat import llama3\b")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _package(m) not in ("models", "chat")))
def test_only_models_and_the_chat_formats_name_the_llama_family(module):
    for lineno, line in enumerate(open(MODULES[module]), 1):
        assert not LLAMA_CODE.search(line), f"{MODULES[module]}:{lineno}: names the Llama family: {line.strip()}"


LONGEST_FUNCTION = 80  # lines: a function a reader takes in on one screen


def test_no_function_is_longer_than_a_screen():
    long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path}:{node.lineno}: {node.name} is {lines} lines")
    assert not long, f"split these (at most {LONGEST_FUNCTION} lines each):\n" + "\n".join(long)
