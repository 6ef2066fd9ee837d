"""The committed JSON Schemas under schemas/ match the wire models, and the drift check catches drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuquota.wire import export
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.topics import TOPICS

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schemas_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    status = export.main(["--check", "--out", str(ROOT / "schemas")])
    assert status == 0, capsys.readouterr().err + "\nrun: .venv/bin/python -m gpuquota.wire.export"


def test_check_names_missing_extra_and_differing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export.main(["--out", str(tmp_path)]) == 0
    assert export.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "Tick.v1.json").unlink()
    (tmp_path / "Retired.v1.json").write_text("{}\n")
    changed = tmp_path / "topics.json"
    changed.write_text(changed.read_text().replace('"pool"', '"node id"', 1))
    capsys.readouterr()

    assert export.main(["--check", "--out", str(tmp_path)]) == 1

    err = capsys.readouterr().err
    assert "missing: Tick.v1.json" in err
    assert "extra: Retired.v1.json" in err
    assert "differs: topics.json" in err and '+      "key": "pool",' in err


def test_writing_removes_stale_files_and_output_is_deterministic(tmp_path: Path) -> None:
    (tmp_path / "Retired.v1.json").write_text("{}\n")
    export.main(["--out", str(tmp_path)])

    assert not (tmp_path / "Retired.v1.json").exists()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == export.render()
    assert all(text.endswith("}\n") for text in export.render().values())


def test_topic_catalogue_points_at_exported_schemas() -> None:
    files = export.render()
    catalogue = json.loads(files["topics.json"])["topics"]
    assert [t["name"] for t in catalogue] == [t.name for t in TOPICS]
    for topic in catalogue:
        assert topic["schema"] in files
        for message in topic["messages"]:
            assert f"{message}.v1.json" in files


def test_dead_letter_keeps_text_and_binary_values() -> None:
    def letter(value: bytes) -> DeadLetter:
        return DeadLetter.of(value, reason="cannot decode", topic="t", partition=0, offset=7, occurred_at=1)

    text, binary = letter(b'{"type": "Nope"}'), letter(b"\xff\x00")

    assert (text.encoding, text.value()) == ("utf-8", b'{"type": "Nope"}')
    assert (binary.encoding, binary.value()) == ("base64", b"\xff\x00")
    assert text.event_id == "dead-letter/t/0/7"
    assert DeadLetter.model_validate_json(binary.model_dump_json()) == binary
