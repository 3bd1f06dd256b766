"""Every key of the configuration with its type, default and field docstring, read from the schema.

Contract: :func:`keys` lists the keys of :class:`~.schema.RunConfig` in declaration order, section by
section (``parallel.dp``, ..., then the top-level keys, then the fields of one ``faults[i]`` entry),
each as a :class:`Key`; the docstrings come from the dataclasses' source (``ast``), so the reference
(:mod:`.reference`) and ``tmslurm-launch --help`` say exactly what the schema says. Failure behaviour: a
field without a docstring raises ValueError naming it (every field must have one).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

from tmslurm.core.config.faults import FaultConfig
from tmslurm.core.config.schema import RunConfig

HIDDEN = ("defaults",)
"""RunConfig fields that are Hydra's machinery, not settings."""


@dataclass(frozen=True, kw_only=True)
class Key:
    """One configuration key as a user writes it in an override."""

    section: str
    """The dataclass field of RunConfig it sits in (``parallel``, ...); empty at the top level;
    ``faults[i]`` for a field of one fault entry."""
    path: str
    """The override path: ``parallel.dp``, ``cluster``, ``faults[i].kind``."""
    type: str
    """The annotation as written in the schema (``int``, ``str | None``)."""
    default: str
    """The default as an override writes it (``2``, ``null``, ``"debug"``, ``[]``), or ``(required)``."""
    doc: str
    """The field docstring, dedented."""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated field of dataclass ``cls`` (``name: type = ...`` then ``\"\"\"doc\"\"\"``)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = inspect.cleandoc(str(after.value.value))
    return docs


def field_types(cls: type) -> dict[str, str]:
    """Each field's annotation as written in the source of ``cls``."""
    tree = ast.parse(inspect.getsource(cls))
    return {
        n.target.id: ast.unparse(n.annotation)
        for n in tree.body[0].body  # type: ignore[attr-defined]
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def format_value(value: Any) -> str:
    """A value as a Hydra override writes it: true/false, null, a bare word, "" for the empty string."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value and " " not in value else f'"{value}"'
    return str(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return format_value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return format_value(f.default_factory())
    return "(required)"


def _keys_of(cls: type, section: str, prefix: str) -> list[Key]:
    docs, types = field_docs(cls), field_types(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in HIDDEN or dataclasses.is_dataclass(f.default_factory):
            continue
        if f.name not in docs:
            raise ValueError(f"{cls.__name__}.{f.name} has no docstring; every config field needs one")
        path = f"{prefix}{f.name}"
        out.append(Key(section=section, path=path, type=types[f.name], default=_default(f), doc=docs[f.name]))
    return out


def sections() -> list[tuple[str, type]]:
    """The sections of RunConfig, in order: (name, dataclass)."""
    return [
        (f.name, f.default_factory)  # type: ignore[misc]
        for f in dataclasses.fields(RunConfig)
        if dataclasses.is_dataclass(f.default_factory)
    ]


def keys() -> list[Key]:
    """Every key: each section's fields, then the top-level ones, then one fault entry's."""
    out: list[Key] = []
    for name, cls in sections():
        out += _keys_of(cls, name, f"{name}.")
    out += _keys_of(RunConfig, "", "")
    out += _keys_of(FaultConfig, "faults[i]", "faults[i].")
    return out


def first_sentence(doc: str) -> str:
    """The docstring's first sentence on one line (up to the first '. ' or the end of its first paragraph)."""
    text = " ".join(doc.split("\n\n")[0].split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]
