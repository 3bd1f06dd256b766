"""``tmslurm-launch --help``: the usage, the config groups with their presets and every key, one line each.

Contract: :func:`usage` returns the help text, written from the schema (each key's type default and the
first sentence of its field docstring, :mod:`tmslurm.core.config.fielddocs`) and the preset files
(:mod:`tmslurm.core.config.presets`), so it cannot drift from them; each line fits ``width`` columns
(a description that does not is cut with "..."). It points to docs/config-reference.md for the whole
text. The benchmark-only sections (``bench``) are left out. Nothing here raises for a well-formed installation.
"""

from __future__ import annotations

from tmslurm.core.config.fielddocs import Key, first_sentence, keys, sections
from tmslurm.core.config.presets import APPENDED_GROUPS, GROUPS, group_doc, group_options
from tmslurm.core.config.schema import BENCH_SECTIONS

HEAD = """usage: tmslurm-launch [--cfg job | --check] [--help] [OVERRIDE ...]

Composes the run's config from Hydra overrides and runs it: here (cluster=local) or as Slurm jobs
(cluster=slurm). --cfg job prints the composed config and starts nothing; --check validates it (and,
inside a Slurm job, the job's nodes against the layout) and writes nothing. A bad override prints one
error: line naming it and exits 2, before anything is written or submitted. hydra.run.dir=DIR is
taken as run_dir=DIR.
"""
TAIL = "Every key with its whole description: docs/config-reference.md (in the repository)."
NAME_WIDTH = 30


def _line(name: str, text: str, width: int) -> str:
    line = f"  {name:<{NAME_WIDTH}} {text}" if len(name) <= NAME_WIDTH else f"  {name} {text}"
    return line if len(line) <= width else line[: width - 3].rstrip() + "..."


def _groups(width: int) -> list[str]:
    out = ["config groups (group=preset; +group=preset for a group without a default):"]
    for group in GROUPS:
        plus = "+" if group in APPENDED_GROUPS else ""
        out += [_line(f"{plus}{group}={name}", group_doc(group, name), width) for name in group_options(group)]
    return out


def _key(k: Key, width: int) -> str:
    return _line(f"{k.path}={k.default}", first_sentence(k.doc), width)


def usage(width: int = 120) -> str:
    """The whole --help text."""
    all_keys = keys()
    out = [HEAD, *_groups(width), "", "keys (key=default  what it sets):"]
    for name, _cls in sections():
        if name in BENCH_SECTIONS:
            continue
        out += [f" {name}:"] + [_key(k, width) for k in all_keys if k.section == name]
    out += [" top level:"] + [_key(k, width) for k in all_keys if k.section == ""]
    out += [" faults[i] (faults='[{step:10,kind:drain,rank:1}]'):"]
    out += [_key(k, width) for k in all_keys if k.section == "faults[i]"]
    return "\n".join([*out, "", TAIL])
