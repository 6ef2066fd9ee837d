"""Writes the wire contract as JSON Schema files: ``python -m gpuquota.wire.export [--check]``.

Into ``schemas/`` (of the current directory, or ``--out``):

* ``<Type>.v<schema_version>.json``: one per message type (inputs, events, node commands, dead letter,
  input result);
* ``scheduler-input.json``, ``scheduler-event.json``, ``node-command.json``: the discriminated unions;
* ``topics.json``: the topic catalogue of ``gpuquota.wire.topics``.

Schemas are pydantic's *validation* schemas (what a consumer of this code accepts), with the wire
models' constraints (ranges, lengths, patterns, enums, no unknown fields), ``type`` and
``schema_version`` required (``Message``'s ``json_schema_extra``) and an ``$id`` each. Output is
deterministic (sorted keys, 2-space indent, trailing newline), so the files are committed and CI
runs ``--check``, which exits 1 and names every missing, extra or differing file. Writing removes
``*.json`` files that no longer correspond to a message type. Regenerate after changing any wire
model or upgrading pydantic (its schema output can change between versions).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand
from gpuquota.wire.topics import TOPICS, Topic, union_members

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID_PREFIX = "urn:gpuquota:schemas:"
"""Each file's ``$id`` is this prefix and its file name: stable, and the same in every checkout."""

UNIONS: dict[str, Any] = {
    "scheduler-input.json": SchedulerInput,
    "scheduler-event.json": SchedulerEvent,
    "node-command.json": NodeCommand,
}


def dump(document: Any) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def message_types() -> list[type[BaseModel]]:
    """Every message type of the contract, each once."""
    found: dict[str, type[BaseModel]] = {}
    for union in UNIONS.values():
        found.update((m.__name__, m) for m in union_members(union))
    found.update((m.__name__, m) for m in (DeadLetter, InputResult))
    return [found[name] for name in sorted(found)]


def message_file(model: type[BaseModel]) -> str:
    return f"{model.__name__}.v{model.model_fields['schema_version'].default}.json"


def _header(name: str) -> dict[str, str]:
    return {"$schema": JSON_SCHEMA_DIALECT, "$id": SCHEMA_ID_PREFIX + name}


def _topic_entry(topic: Topic) -> dict[str, Any]:
    return {
        "name": topic.name,
        "key": topic.key,
        "partitions": topic.partitions,
        "config": topic.config(),
        "schema": topic.schema,
        "messages": [m.__name__ for m in topic.messages],
        "description": topic.description,
    }


def render() -> dict[str, str]:
    """File name -> content of every file ``schemas/`` should hold."""
    files: dict[str, str] = {}
    for model in message_types():
        name = message_file(model)
        files[name] = dump({**_header(name), **model.model_json_schema()})
    for name, union in UNIONS.items():
        schema = TypeAdapter(union).json_schema()
        files[name] = dump({**_header(name), "title": name.removesuffix(".json"), **schema})
    files["topics.json"] = dump({"topics": [_topic_entry(t) for t in TOPICS]})
    for topic in TOPICS:  # the catalogue must point at files that exist
        assert topic.schema in files, f"{topic.name}: no schema file {topic.schema}"
    return files


def differences(out: Path, files: dict[str, str]) -> list[str]:
    """One line per problem (missing, extra, differing file), followed by a short diff of each."""
    present = {p.name for p in out.glob("*.json")} if out.is_dir() else set()
    problems = [f"missing: {name}" for name in sorted(files.keys() - present)]
    problems += [f"extra: {name}" for name in sorted(present - files.keys())]
    for name in sorted(files.keys() & present):
        actual = (out / name).read_text(encoding="utf-8")
        if actual != files[name]:
            diff = difflib.unified_diff(
                actual.splitlines(), files[name].splitlines(), f"{name} (on disk)", f"{name} (code)", n=1
            )
            problems.append(f"differs: {name}")
            problems += [f"    {line}" for line in list(diff)[2:22]]
    return problems


def write(out: Path, files: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    for name, content in files.items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != content:
            path.write_text(content, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuquota.wire.export", description="Write the wire contract as JSON Schema files."
    )
    parser.add_argument("--out", type=Path, default=Path("schemas"), help="directory (default: ./schemas)")
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on drift")
    args = parser.parse_args(argv)
    files = render()
    if not args.check:
        write(args.out, files)
        print(f"wrote {len(files)} schema files to {args.out}")
        return 0
    problems = differences(args.out, files)
    if problems:
        print(f"{args.out} is out of date with the wire models:", file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        print("regenerate: python -m gpuquota.wire.export", file=sys.stderr)
        return 1
    print(f"{args.out}: {len(files)} schema files up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
