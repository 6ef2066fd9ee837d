"""``gpuquota trace generate``, ``gpuquota simulate`` and their errors, run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuquota.entrypoints.cli import main

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "worked-example.yaml"
OTHER = """\
schedulingPolicy: {name: policy}
jobQueue: {name: jq}
serviceEnvironment: {name: se, capacityLimits: {ml.g5.xlarge: 3}}
quotaShares:
  - {name: QS1, capacityLimits: {ml.g5.xlarge: 2}, strategy: LEND_AND_BORROW, borrowLimit: 50}
  - {name: QS2, capacityLimits: {ml.g5.xlarge: 1}, strategy: LEND}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture
def trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    rc, _, err = run(
        capsys,
        "trace",
        "generate",
        "--jobs",
        "300",
        "--shares",
        "QS1:2,QS2:1,QS3:1",
        "--rate-per-hour",
        "4",
        "--median-duration",
        "1200",
        "--preemption-retries",
        "3",
        "-o",
        str(path),
    )
    assert rc == 0, err
    return path


def test_generate_writes_the_trace_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "trace", "generate", "--jobs", "3", "--seed", "5")
    assert rc == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3 and set(lines[0]) == {
        "submitted_at",
        "share",
        "priority",
        "unit",
        "instances",
        "duration",
        "exit_code",
    }


def test_simulate_compares_configurations(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(OTHER)
    rc, out, err = run(
        capsys, "simulate", "-f", str(EXAMPLE), "-f", str(other), "--trace", str(trace), "--output", "json"
    )
    assert rc == 0, err
    first, second = json.loads(out)["configurations"]
    assert first["configuration"] == "worked-example.yaml" and second["configuration"] == "other.yaml"
    assert set(first["shares"]) == {"QS1", "QS2", "QS3", "(pool)"}
    assert set(second["shares"]) == {"QS1", "QS2", "(pool)"}
    assert first["shares"]["(pool)"]["jobs_finished"] == 300
    assert second["shares"]["QS1"]["jobs_rejected"] == 0
    qs3 = first["shares"]["QS3"]["jobs_submitted"]
    assert second["shares"]["(pool)"]["jobs_rejected"] == qs3 > 0  # other.yaml has no QS3
    rc, out, _ = run(
        capsys, "simulate", "-f", str(EXAMPLE), "-f", str(other), "--trace", str(trace), "--quiet"
    )
    assert rc == 0
    assert out.splitlines()[0].split() == ["share", "metric", "worked-example.yaml", "other.yaml"]
    assert any(line.startswith("QS3") and line.split()[-1] == "-" for line in out.splitlines())


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_simulate_draws_a_plot(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    plot = tmp_path / f"plot{suffix}"
    rc, _, err = run(capsys, "simulate", "-f", str(EXAMPLE), "--trace", str(trace), "--plot", str(plot))
    assert rc == 0, err
    data = plot.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:1000]
    assert f"plot written to {plot}" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "missing.jsonl"], "gpuquota simulate: cannot read missing.jsonl"),
        (
            ["--trace", "TRACE", "--plot", "x.pdf"],
            "gpuquota simulate: --plot x.pdf: the file must end in .png or .svg",
        ),
        (["--trace", "BAD"], "gpuquota simulate: BAD:2: duration: Field required"),
    ],
)
def test_simulate_errors_are_one_line(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        trace.read_text().splitlines()[0] + '\n{"submitted_at": 9e9, "share": "QS1", "unit": "u"}\n'
    )
    argv = [str(trace) if a == "TRACE" else str(bad) if a == "BAD" else a for a in argv]
    rc, out, err = run(capsys, "simulate", "-f", str(EXAMPLE), *argv)
    assert rc == 1 and out == ""
    assert err.replace(str(bad), "BAD").startswith(message)


def test_a_configuration_without_capacity_is_refused(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "shares.yaml"
    config.write_text("quotaShares:\n  - {name: QS1, jobQueue: q, capacityLimits: {u: 1}, strategy: LEND}\n")
    rc, _, err = run(capsys, "simulate", "-f", str(config), "--trace", str(trace))
    assert rc == 1 and "needs a serviceEnvironment" in err


def test_export_needs_a_recorded_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "trace", "export", "--data-dir", str(tmp_path))
    assert rc == 1 and "no recorded log at" in err


def test_a_configuration_the_core_refuses_is_an_error(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "many.yaml"
    shares = "".join(
        f"  - {{name: S{i}, capacityLimits: {{ml.g5.xlarge: 1}}, strategy: LEND}}\n" for i in range(21)
    )
    config.write_text(OTHER.split("quotaShares:")[0] + "quotaShares:\n" + shares)
    rc, _, err = run(capsys, "simulate", "-f", str(config), "--trace", str(trace))
    assert rc == 1 and "many.yaml: Job queue jq already has 20 quota shares" in err
