"""gpuquota.entrypoints.cli: a thin argparse dispatcher."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuquota import __version__
from gpuquota.entrypoints.cli import main


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
        [sys.executable, "-m", "gpuquota", "version"], capture_output=True, text=True, check=False
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, f"gpuquota {__version__}")


def test_dash_dash_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"gpuquota {__version__}\n"


def test_a_bad_flag_prints_the_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, prog in (
        (["shares", "--sahre=x"], "gpuquota shares"),
        (["jobs", "list", "--sahre", "x"], "gpuquota jobs list"),
        (["nodes", "drain", "n", "--bogus"], "gpuquota nodes drain"),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2
        assert err.startswith(f"usage: {prog} ")
        assert err.endswith(
            f"{prog}: error: unrecognized arguments: {' '.join(argv[-2:]) if argv[-1] == 'x' else argv[-1]}\n"
        )


def test_global_options_before_or_after_the_subcommand() -> None:
    from gpuquota.entrypoints.cli import build_parser, parse

    parser = build_parser()
    for argv in (
        ["--output", "json", "--endpoint", "http://h:1", "shares"],
        ["shares", "-o", "json", "--endpoint", "http://h:1"],
        ["-o", "json", "shares", "--endpoint", "http://h:1"],
    ):
        args = parse(parser, argv)
        assert (args.output, args.endpoint) == ("json", "http://h:1"), argv
    defaults = parse(parser, ["jobs", "list"])
    assert (defaults.output, defaults.endpoint) == ("table", None)
    later_wins = parse(parser, ["-o", "json", "jobs", "list", "-o", "table"])
    assert later_wins.output == "table"


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "gpuquota" in script and "_ARGCOMPLETE" in script


def test_completion_completes_subcommands_and_flags() -> None:
    """What the shell gets back through argcomplete's protocol (the environment a shell sets)."""
    import os

    line = "gpuquota jobs su"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": "/dev/stdout",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "gpuquota"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["submit"]


@pytest.mark.skipif(
    sys.version_info >= (3, 13), reason="Python 3.13's argparse lays out options differently (-o, --output X)"
)
def test_docs_cli_md_embeds_every_commands_help() -> None:
    """docs/cli.md holds the ``--help`` of every command; ``python -m gpuquota.entrypoints.helpdoc`` rewrites
    it."""
    from gpuquota.entrypoints import helpdoc

    text = helpdoc.DOC.read_text()
    assert helpdoc.embedded(text) == helpdoc.reference(), "run: python -m gpuquota.entrypoints.helpdoc"
    for command in ("jobs submit", "jobs logs", "nodes drain", "completion", "shares"):
        assert f"### `gpuquota {command}`" in text
