"""Every benchmark script imports as `python benchmarks/<script>.py` would run it: one that
imports a helper the tests moved fails here, not an hour into `make bench`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_every_benchmark_script_imports():
    scripts = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
    assert "bench_autoscaling" in scripts
    # One interpreter for all (each import is what running the script does before main()).
    program = ("import importlib, sys\n"
               f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
               "failed = []\n"
               f"for name in {scripts!r}:\n"
               "    try:\n"
               "        importlib.import_module(name)\n"
               "    except Exception as error:\n"
               "        failed.append(f'{name}: {error!r}')\n"
               "print('\\n'.join(failed))\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                            cwd=BENCHMARKS.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"benchmarks that do not import:\n{result.stdout}"
