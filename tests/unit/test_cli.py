"""gpuquota.cli: a thin argparse dispatcher."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuquota import __version__
from gpuquota.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"gpuquota {__version__}\n"


@pytest.mark.parametrize("command", ["gateway", "scheduler", "node-agent"])
def test_services_without_configuration_exit_2_naming_the_variable(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL", "GPUQUOTA_NODE_ID"):
        monkeypatch.delenv(name, raising=False)
    assert main([command]) == 2
    captured = capsys.readouterr()
    assert "GPUQUOTA_KAFKA" in captured.err
    assert captured.out == ""


def test_usage_errors_exit_2() -> None:
    for argv in ([], ["no-such-command"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2


def test_module_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuquota.cli", "version"], capture_output=True, text=True, check=False
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, f"gpuquota {__version__}")
