"""The product's command line takes `sandbox` from the sandbox's entry point, and goes on without
it where the plugin's package is absent, as in the operator image."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import pytest

from llmfleet import cli, exit_codes


def _with_plugins(monkeypatch, *plugins: EntryPoint) -> None:
    monkeypatch.setattr(cli.importlib.metadata, "entry_points", lambda group: list(plugins))


def test_the_sandbox_command_comes_from_its_entry_point():
    declared = {plugin.name: plugin.value for plugin in entry_points(group=cli.CLI_PLUGIN_GROUP)}
    assert declared == {"sandbox": "llmfleet_sandbox.cli:add_commands"}
    args = cli.build_parser().parse_args(["sandbox", "--instance", "1", "status"])
    assert args.handler.__module__ == "llmfleet_sandbox.cli"
    assert (args.command, args.sandbox_command, args.instance) == ("sandbox", "status", 1)


def test_a_plugin_error_is_reported_like_the_products(capsys):
    assert cli.main(["sandbox", "--instance", "99", "status"]) == exit_codes.BAD_INPUT
    assert capsys.readouterr().err == "llmfleet sandbox: --instance must be within 0..9, got 99\n"


def test_without_the_plugins_package_there_is_no_sandbox_command(monkeypatch, capsys):
    _with_plugins(monkeypatch, EntryPoint("sandbox", "llmfleet_absent_plugin.cli:add_commands", cli.CLI_PLUGIN_GROUP))
    parser = cli.build_parser()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["sandbox", "up"])
    assert exited.value.code == 2
    assert "invalid choice: 'sandbox'" in capsys.readouterr().err
    assert parser.parse_args(["plan", "-f", "-"]).command == "plan"


def test_a_plugin_missing_a_dependency_fails_loudly(monkeypatch, tmp_path):
    (tmp_path / "llmfleet_broken_plugin.py").write_text(
        "import llmfleet_missing_dependency\n\n\ndef add_commands(commands):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _with_plugins(monkeypatch, EntryPoint("broken", "llmfleet_broken_plugin:add_commands", cli.CLI_PLUGIN_GROUP))
    with pytest.raises(ModuleNotFoundError, match="llmfleet_missing_dependency"):
        cli.build_parser()
