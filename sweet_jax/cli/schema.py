"""Typed config sections: every job setting declared once, with its type, default and one-line meaning, and checked
when a config loads, before any data is read or any device touched.

A section is a frozen pydantic model (`Section`) whose fields are `setting(default, "meaning")`; a field whose type
is a `Literal[...]` is an enum, a field typed as another section is a nested section. Cross-field rules are
`@pydantic.model_validator(mode="after")` methods that raise `ValueError("the rule, naming its fields")`.

Config files stay Python (`get_config()` returns an ml_collections ConfigDict, started from the schema's own
defaults: `Section().to_config_dict()`), and `--config.a.b=value` overrides stay ml_collections'. Then
`Section.load(config, source=path)` turns the result into the typed section, or raises `SchemaError`, which names the
file (and the line that sets the field, where one does), the field and the rule:

    configs/critic_tiny.py:14: field 'optim.batch_size': must be a multiple of optim.micro_batch_size (8), got 12

Why pydantic rather than frozen dataclasses: the types, enums and nested sections are checked by a validator that
already ships with the project (the OpenAI-compatible server's request models), with the failing field's path in every
error, and the same models give the settings reference in docs/ (`reference_markdown`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import typing
from collections.abc import Mapping

import pydantic
from pydantic import BaseModel, ConfigDict, Field


class SchemaError(ValueError):
    """A config that breaks its schema: the message names the file (and line), the field and the rule."""


def setting(default=..., meaning: str = "", *, factory=None):
    """A field of a section: its default (or `factory` for a mutable one) and its one-line meaning."""
    if factory is not None:
        return Field(default_factory=factory, description=meaning)
    return Field(default, description=meaning)


def section(cls: type[Section], meaning: str):
    """A nested section field, defaulting to the section's own defaults."""
    return Field(default_factory=cls, description=meaning)


class Section(BaseModel):
    """A typed, frozen, closed group of settings (an unknown field is an error)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    where: typing.ClassVar[str] = ""  # the section's dotted place in a job config ("loss."), for the messages

    # ------------------------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, values, *, source: str = "", prefix: str | None = None):
        """The section from a mapping (an ml_collections ConfigDict, a dict from JSON), or `SchemaError`. `prefix`
        is the section's dotted place in a larger config, for the messages (default: `where`)."""
        if isinstance(values, cls):
            return values
        try:
            return cls.model_validate(_plain(values))
        except pydantic.ValidationError as e:
            raise SchemaError(_message(cls, e, source, cls.where if prefix is None else prefix)) from None

    @classmethod
    def of(cls, values):
        """`load` for a section passed around in code: the section itself, a mapping, or None (the defaults)."""
        return cls() if values is None else cls.load(values)

    # ------------------------------------------------------------------------------------------- views
    def to_dict(self) -> dict:
        """Plain values, nested sections as dicts, in the order the fields are declared."""
        return self.model_dump()

    def to_config_dict(self):
        """The same values as an ml_collections ConfigDict: what a config file starts from and overrides."""
        import ml_collections

        return ml_collections.ConfigDict(_config_values(self))

    def replace(self, **changes):
        """A copy with some fields changed, validated."""
        return type(self).load({**self.model_dump(), **changes})

    def dotted(self, prefix: str = ""):
        """(dotted name, value) of every setting, nested sections flattened."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, Section):
                yield from value.dotted(f"{prefix}{name}.")
            else:
                yield prefix + name, value


def _config_values(s: Section) -> dict:
    import ml_collections

    out = {}
    for name in type(s).model_fields:
        value = getattr(s, name)
        if isinstance(value, Section):
            value = ml_collections.ConfigDict(_config_values(value))
        elif isinstance(value, dict):
            value = ml_collections.ConfigDict(value)
        out[name] = value
    return out


def _plain(values):
    """Mappings as dicts (ConfigDicts included, in the order their fields were set) and lists as tuples (JSON),
    recursively."""
    fields = getattr(values, "_fields", None)  # a ConfigDict's own order (its keys() are sorted)
    if fields is not None and not isinstance(values, Section):
        return {k: _plain(values[k]) for k in fields}
    if isinstance(values, Mapping):
        return {k: _plain(v) for k, v in values.items()}
    if isinstance(values, list):
        return tuple(_plain(v) for v in values)
    return values


# ------------------------------------------------------------------------------------------------ messages
def _leaves(cls: type[Section], prefix: str = ""):
    """(dotted name, field info) of every setting of a section class, nested sections flattened."""
    for name, info in cls.model_fields.items():
        sub = _section_type(info.annotation)
        if sub:
            yield from _leaves(sub, f"{prefix}{name}.")
        else:
            yield prefix + name, info


def field_names(cls: type[Section], prefix: str = "") -> list[str]:
    """Every dotted setting name of a section class, nested sections flattened."""
    return [name for name, _ in _leaves(cls, prefix)]


def _section_type(annotation):
    return annotation if isinstance(annotation, type) and issubclass(annotation, Section) else None


def nearest(name: str, known: list[str]) -> list[str]:
    """Up to three known dotted names closest to `name` (by the whole name, or its last part)."""
    leaf = name.rsplit(".", 1)[-1]

    def closeness(k: str) -> float:
        return max(difflib.SequenceMatcher(None, name, k).ratio(),
                   difflib.SequenceMatcher(None, leaf, k.rsplit(".", 1)[-1]).ratio())

    return sorted((k for k in known if closeness(k) >= 0.5), key=lambda k: (-closeness(k), k))[:3]


def line_of(source: str, field: str) -> int | None:
    """The first line of the config file `source` ("path" or "path:arg") that sets the field's last part, if any."""
    path = source.split(":", 1)[0] if source else ""
    if not path or not os.path.isfile(path):
        return None
    leaf = re.escape(field.rsplit(".", 1)[-1])
    pattern = re.compile(rf"(\.{leaf}\s*=[^=]|\b{leaf}\s*=[^=]|[\"']{leaf}[\"']\s*:|\b{leaf}=)")
    with open(path) as fh:
        for i, text in enumerate(fh, 1):
            if pattern.search(text.split("#", 1)[0]):
                return i
    return None


def _message(cls: type[Section], error: pydantic.ValidationError, source: str, prefix: str) -> str:
    known = field_names(cls)
    lines = []
    for e in error.errors():
        loc = ".".join(str(p) for p in e["loc"] if not isinstance(p, int))
        field = prefix + loc
        if e["type"] == "extra_forbidden":
            near = nearest(loc, known)
            hint = f"; the closest known fields: {', '.join(prefix + n for n in near)}" if near else ""
            rule = f"unknown field{hint}"
        elif e["type"] in ("value_error", "assertion_error"):
            rule = re.sub(r"^(Value|Assertion) error, ", "", e["msg"])
        else:
            rule = f"{e['msg'][0].lower()}{e['msg'][1:]}, got {_shown(e.get('input'))}"
        line = line_of(source, field) if loc else None
        where = f"{source}:{line}: " if line else (f"{source}: " if source else "")
        lines.append(f"{where}field {field!r}: {rule}" if loc else f"{where}{rule}")
    return "\n".join(lines)


def _shown(value) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return f"{text} ({type(value).__name__})"


# ------------------------------------------------------------------------------------------------ docs
def _type_name(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if _section_type(annotation):
        return "section"
    name = getattr(annotation, "__name__", None) or str(annotation)
    return {"tuple": "strings", "dict": "mapping"}.get(name, name).replace("typing.", "")


def reference_markdown(cls: type[Section], prefix: str = "", only: tuple[str, ...] | None = None) -> str:
    """A Markdown table of every setting (`only`: of these top-level ones): name, type, default and meaning (nested
    sections in place)."""
    rows = []

    def walk(c: type[Section], p: str) -> None:
        defaults = c()
        for name, info in c.model_fields.items():
            if c is cls and only is not None and name not in only:
                continue
            sub = _section_type(info.annotation)
            if sub:
                rows.append(f"| **`{p}{name}`** | section | | {info.description or ''} |")
                walk(sub, f"{p}{name}.")
                continue
            default = json.dumps(getattr(defaults, name))
            meaning = (info.description or "").replace("|", "\\|")
            rows.append(f"| `{p}{name}` | {_type_name(info.annotation)} | `{default}` | {meaning} |")

    walk(cls, prefix)
    return "\n".join(["| setting | type | default | meaning |", "|---|---|---|---|", *rows])


def show(config: Section) -> str:
    """The resolved config, one `name = value  # meaning` line per setting, defaults included."""
    meanings = {name: info.description or "" for name, info in _leaves(type(config))}
    lines = [f"{k} = {json.dumps(v)}" for k, v in config.dotted()]
    width = min(56, max(map(len, lines)))
    return "\n".join(line.ljust(width) + (f"  # {meanings[k]}" if meanings[k] else "")
                     for line, (k, _) in zip(lines, config.dotted()))
