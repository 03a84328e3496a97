"""`llmfleet load` flag errors and exit codes (no server needed)."""

from __future__ import annotations

import socket

import pytest

from llmfleet.cli import main


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("flags, message", [
    (["--target", "localhost"], "--target: 'localhost' is not HOST:PORT"),
    (["--target", "a:1,b:2"], "--target takes one HOST:PORT; for several use --endpoints"),
    (["--target", "a:1", "--schedule", "steps:0:2,60"], "--schedule steps:0:2,60: point '60' must be TIME_S:RATE"),
    (["--target", "a:1", "--input-tokens", "uniform:9"], "--input-tokens uniform:9: 'uniform:9' is not a length"),
    (["--target", "a:1", "--sweep", "1,x"], "--sweep 1,x: expected whole numbers"),
    (["--target", "a:1", "--duration-s", "0"], "--duration-s must be greater than 0"),
    (["--target", "a:1", "--shared-prefix-fraction", "2"], "--shared-prefix-fraction must be within 0..1"),
    (["--target", "a:1", "--trace", "/nonexistent.csv"], "--trace: cannot read /nonexistent.csv"),
    (["--target", "a:1", "--schedule", "csv:/nonexistent.csv"], "--schedule: cannot read /nonexistent.csv"),
])
def test_bad_flags_exit_2_and_name_the_flag(flags, message, capsys):
    assert main(["load", *flags]) == 2
    assert message in capsys.readouterr().err


def test_schedule_with_no_arrival_in_the_run_is_refused(tmp_path, capsys):
    # 0.001 requests/s over 1 s: with this seed nothing arrives; caught before any connection.
    assert main(["load", "--target", "a:1", "--schedule", "0.001", "--duration-s", "1",
                 "--output-dir", str(tmp_path)]) == 2
    assert "no request arrives within --duration-s" in capsys.readouterr().err


def test_unreachable_target_exits_3(tmp_path, capsys):
    assert main(["load", "--target", f"127.0.0.1:{_closed_port()}", "--duration-s", "1",
                 "--output-dir", str(tmp_path)]) == 3
    assert "does not answer gRPC" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written for a run that never started


def test_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["load", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "Exit codes: 0 every request completed" in out and "steps:0:2,60:8,120:2" in out
