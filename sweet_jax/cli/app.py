"""The one command-line stack of every `python -m sweet_jax.<command>`: absl flags throughout.

- Commands that run a job config take ml_collections' `--config FILE` and `--config.a.b=value` overrides (train,
  plan, collect, pipeline).
- The others declare their flags as a typed settings dataclass: each field is the flag of the same name, with its
  type, default and help (`flag(...)` metadata). Its library function takes that dataclass, and a parent job (the
  pipeline) builds the child's command line from the same dataclass with `command_line`, so flag strings are never
  written by hand.
- Flag names may be spelt with dashes or underscores (`--max-tokens 8` is `--max_tokens=8`); a boolean is set with
  `--name` and cleared with `--noname`.
- Every command gets the same one-line error for a misspelt flag or a bad value (`error: bad command line: ...`,
  exit 2), and prints `error: ...` with exit 2 for a bad input file or setting (`run(..., errors=...)`).

    @dataclasses.dataclass(frozen=True)
    class ServeSettings:
        model: str = flag(help="HF checkpoint directory, or a training run", required=True)
        port: int = flag(8000, help="the port to listen on")

    def main(settings: ServeSettings) -> int: ...
    if __name__ == "__main__":
        run(main, ServeSettings, errors=(ModelLoadError,))
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence

from absl import app, flags

QUIET_LOGGERS = ("absl", "jax", "orbax", "datasets", "httpx", "httpx2", "openai", "filelock")
FLAGS = flags.FLAGS
_REQUIRED = object()


def flag(default=_REQUIRED, *, help: str, choices: Sequence[str] | None = None, required: bool = False,
         positional: bool = False):
    """A settings field that is a command-line flag. `required=True` (or no default) makes it mandatory; `choices`
    makes a string flag an enum; a `list[str]` field is a repeatable flag (or, with `positional`, the command's
    positional arguments)."""
    meta = {"help": help, "choices": tuple(choices) if choices else None, "positional": positional}
    if positional:
        return dataclasses.field(default_factory=list, metadata={**meta, "required": required})
    if default is _REQUIRED or required:
        return dataclasses.field(default=None, metadata={**meta, "required": True})
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={**meta, "required": False})
    return dataclasses.field(default=default, metadata={**meta, "required": False})


def setup_logging() -> None:
    """INFO logs on stderr with timestamps; the chatty libraries at WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr, force=True)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# ------------------------------------------------------------------------------------------- settings <-> flags
def _fields(cls) -> list[tuple[dataclasses.Field, object]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if "help" in f.metadata]


def _base(tp) -> type:
    """str | None -> str; list[str] -> list."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base(args[0])
    return typing.get_origin(tp) or tp


def _default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def define_settings(cls, flag_values: flags.FlagValues = FLAGS) -> None:
    """Define one absl flag per field of the settings dataclass `cls`, listed by the command's --help."""
    module = sys.argv[0]  # absl's --help lists the flags of the main module
    for f, tp in _fields(cls):
        m, base = f.metadata, _base(tp)
        if m["positional"]:
            continue
        default = None if m["required"] else _default(f)
        kw = dict(flag_values=flag_values, module_name=module)
        if base is bool:
            flags.DEFINE_boolean(f.name, default, m["help"], **kw)
        elif base is int:
            flags.DEFINE_integer(f.name, default, m["help"], **kw)
        elif base is float:
            flags.DEFINE_float(f.name, default, m["help"], **kw)
        elif base is list:
            flags.DEFINE_multi_string(f.name, default, m["help"], **kw)
        elif m["choices"]:
            flags.DEFINE_enum(f.name, default, list(m["choices"]), m["help"], **kw)
        else:
            flags.DEFINE_string(f.name, default, m["help"], **kw)
        if m["required"]:
            flags.mark_flag_as_required(f.name, flag_values)


def settings_from_flags(cls, positional: Sequence[str] = (), flag_values: flags.FlagValues = FLAGS):
    """The settings dataclass `cls` from the parsed flags (and the positional arguments)."""
    values = {}
    if positional and not any(f.metadata["positional"] for f, _ in _fields(cls)):
        _bad_command_line(f"unexpected arguments {' '.join(positional)!r} (this command takes flags only)")
    for f, _ in _fields(cls):
        if f.metadata["positional"]:
            if f.metadata["required"] and not positional:
                _bad_command_line(f"give at least one {f.name.upper()}")
            values[f.name] = list(positional)
        else:
            values[f.name] = flag_values[f.name].value
    return cls(**values)


def command_line(module: str, settings=None, *, subcommand: str | None = None, config: str | None = None,
                 overrides: Sequence[str] | Mapping[str, object] = (), extra_flags: Sequence[str] = ()) -> list[str]:
    """The arguments of `python -m sweet_jax.<module>` that run it with `settings` (a settings dataclass: every field
    that differs from its default, as a flag) or with `config` and its `--config.x=y` overrides (strings "a.b=v" or a
    mapping), then `extra_flags`, the command's own flags ("--name=value" strings). `subcommand` comes first."""
    args = ["-m", f"sweet_jax.{module}"] + ([subcommand] if subcommand else [])
    if config is not None:
        args.append(f"--config={config}")
        items = overrides.items() if isinstance(overrides, Mapping) else (o.split("=", 1) for o in overrides)
        args += [f"--config.{k}={v}" for k, v in items]
    if settings is not None:
        positional = []
        for f, tp in _fields(type(settings)):
            value = getattr(settings, f.name)
            if f.metadata["positional"]:
                positional += list(value)
                continue
            if value == _default(f) and not f.metadata["required"]:
                continue
            if _base(tp) is bool:
                args.append(f"--{f.name}" if value else f"--no{f.name}")
            elif _base(tp) is list:
                args += [f"--{f.name}={v}" for v in value]
            elif value is not None:
                args.append(f"--{f.name}={value}")
        args += positional
    return args + list(extra_flags)


# ------------------------------------------------------------------------------------------------- running
def _bad_command_line(msg: str) -> typing.NoReturn:
    print(f"error: bad command line: {' '.join(msg.split())}", file=sys.stderr)
    sys.exit(2)


def require_config(config, example: str, schema=None, name: str = "config"):
    """The parsed `--config`, or the command-line error that names an example. With `schema` (a `schema.Section`
    class, or a function of (config, source) that picks one), the config validated against it: a
    `schema.SchemaError` names the file, line, field and rule."""
    if config is None:
        _bad_command_line(f"--config is required, e.g. --config {example}")
    if schema is None:
        return config
    from ml_collections import config_flags

    return getattr(schema, "load", schema)(config, source=config_flags.get_config_filename(FLAGS[name]))


def config_file(path: str, overrides: Sequence[str] = (), schema=None):
    """The config a command gets from `--config=path --config.KEY=VALUE ...` (each of `overrides` "KEY=VALUE"),
    parsed as the command parses it and, with `schema`, validated as `require_config` validates it: a pipeline checks
    its stages' jobs with it before it starts the first. ValueError names the file and the override that names no
    field or whose value does not parse; `schema.SchemaError` the field and rule."""
    from ml_collections import config_flags

    values = flags.FlagValues()
    argv = ["config", f"--config={path}", *(f"--config.{o}" for o in overrides)]
    config_flags.DEFINE_config_file("config", None, "the job config", flag_values=values, lock_config=True,
                                    sys_argv=argv)  # the overrides' flags are defined from these arguments
    try:
        values(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(_unknown_config_field(argv, values=values) or f"{path}: {' '.join(str(e).split())}") from None
    return schema.load(values.config, source=path) if schema is not None else values.config


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, with a one-line error (no traceback) for a bad flag or override such as a misspelt config key.
    Flag names may be spelt with dashes (`--hbm-gib 80` is `--hbm_gib 80`)."""
    argv = [argv[0]] + [_underscored(a) for a in argv[1:]]
    try:
        return FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        msg = _unknown_config_field(argv)
        if msg is None:
            msg = str(e.args[0] if isinstance(e, AttributeError) and e.args else e)
            if isinstance(e, AttributeError):  # ml_collections: "'key'\nDid you mean ...", wrapped in a repr
                msg = msg.strip("'").replace("\\n", " ").replace("\\'", "'")
        _bad_command_line(msg)


def _unknown_config_field(argv: list[str], name: str = "config", values: flags.FlagValues = FLAGS) -> str | None:
    """For a `--config.a.b=v` override that names no field of the job config: the message that says so and lists
    the config's closest fields; None when every override names a field (the error was something else)."""
    from sweet_jax.cli.schema import nearest

    path = next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), None)
    if path is None and f"--{name}" in argv[:-1]:
        path = argv[argv.index(f"--{name}") + 1]
    if path is None or name not in values:
        return None
    try:
        config = values[name].parser.parse(path)
    except Exception:  # noqa: BLE001 - the config file's own error is the one to report
        return None
    fields = dict(_config_fields(config))
    for arg in argv[1:]:
        m = arg.split("=", 1)[0]
        if not m.startswith(f"--{name}.") and not m.startswith(f"--no{name}."):
            continue
        field = m.split(".", 1)[1]
        if field in fields or any(f.startswith(field + ".") for f in fields) or "[" in field:
            continue
        leaves = [f for f, value in fields.items() if not _is_section(value)]
        near = nearest(field, leaves)
        hint = f"; the closest known fields: {', '.join(near)}" if near else ""
        return f"unknown config field {field!r} (--{name}.{field}) in {path}{hint}"
    return None


def _is_section(value) -> bool:
    return hasattr(value, "items") and hasattr(value, "keys")


def _config_fields(config, prefix: str = ""):
    """(dotted name, value) of every field of a job config, nested sections included."""
    for key, value in config.items():
        yield prefix + key, value
        if _is_section(value):
            yield from _config_fields(value, f"{prefix}{key}.")


def _underscored(arg: str) -> str:
    if not arg.startswith("--") or arg.startswith("--config"):
        return arg
    name, eq, value = arg[2:].partition("=")
    return "--" + name.replace("-", "_") + eq + value


def run(main: Callable[..., int], settings=None, *, subcommands: Mapping[str, tuple[type, Callable]] | None = None,
        errors: tuple[type[BaseException], ...] = (), logs: bool = True) -> None:
    """Parse the command line and call the command, then exit with its status.

    - `main(argv)` alone: the flags the module defined itself (the config-file commands);
    - `main(settings)` with a settings dataclass: its flags (positional fields get the leftover arguments);
    - `subcommands={name: (settings class, function)}`: the first argument names the subcommand, whose own flags
      are defined; `function(settings)` returns a JSON-able result, printed on stdout.
    An exception of the `errors` types (and a config that breaks its schema) prints `error: <message>` and exits 2."""
    from sweet_jax.cli.schema import SchemaError

    errors = (*errors, SchemaError)

    def call(fn, *args) -> int:
        if logs:
            setup_logging()
        try:
            return fn(*args)
        except errors as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    if subcommands is not None:
        names = ", ".join(subcommands)
        if len(sys.argv) < 2 or sys.argv[1] not in subcommands:
            given = f" {sys.argv[1]!r}" if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""
            _bad_command_line(f"unknown or missing subcommand{given}: expected one of {names}, e.g. "
                              f"`python -m {_module()} {next(iter(subcommands))} --help`")
        name = sys.argv.pop(1)
        cls, fn = subcommands[name]
        define_settings(cls)

        def sub_main(argv):
            import json

            result = call(fn, settings_from_flags(cls, argv[1:]))
            if isinstance(result, int):
                return result
            print(json.dumps(result))
            return 0

        app.run(sub_main, flags_parser=parse_flags)
    elif settings is not None:
        define_settings(settings)
        app.run(lambda argv: call(main, settings_from_flags(settings, argv[1:])), flags_parser=parse_flags)
    else:
        app.run(lambda argv: call(main, argv), flags_parser=parse_flags)


def _module() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else sys.argv[0]
