"""Run every benchmark and assemble docs/benchmarks.md from their sections.

Each benchmark writes its own docs/benchmarks/<name>.md; this script runs them
in order (the sandbox ones need root and a free sandbox) and then joins the
sections. `--collect` only joins the sections already written.
Run: sudo .venv/bin/python benchmarks/run_all.py [--collect] [--cold-build]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTIONS = REPO / "docs" / "benchmarks"
OUTPUT = REPO / "docs" / "benchmarks.md"
# Benchmark script -> the section it writes, in report order.
BENCHMARKS = (
    ("bench_sandbox.py", "sandbox.md"),
    ("bench_planner.py", "planner.md"),
    ("bench_plan_layouts.py", "plan-layouts.md"),
    ("fit_calibration.py", "calibration.md"),
    ("bench_planner_accuracy_moe.py", "planner-accuracy-moe.md"),
    ("bench_planner_load_accuracy.py", "planner-load-accuracy.md"),
    ("bench_planner_vs_emulator.py", "planner-vs-emulator.md"),
    ("bench_emulator.py", "emulator.md"),
    ("bench_reconcile.py", "reconcile.md"),
    ("bench_pass.py", "pass.md"),
    ("bench_autoscaling.py", "autoscaling.md"),
    ("bench_scrape_intervals.py", "scrape-intervals.md"),
    ("sweep_autoscaler_defaults.py", "autoscaler-defaults.md"),
    ("bench_simulate_vs_live.py", "simulate-vs-live.md"),
    ("bench_routing.py", "routing.md"),
    ("bench_ttft_histogram.py", "ttft-histogram.md"),
    ("bench_rollout.py", "rollout.md"),
    ("bench_groups.py", "groups.md"),
    ("bench_scale.py", "scale.md"),
)


def rebase_links(text: str) -> str:
    """A section's relative links, written from docs/benchmarks/, made to resolve from
    docs/benchmarks.md (`autoscaling-log.md` -> `benchmarks/autoscaling-log.md`,
    `../autoscaling.md` -> `autoscaling.md`); external links and anchors stay."""
    def rebase(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|#|/", target):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        rebased = os.path.relpath(os.path.normpath(os.path.join(SECTIONS.name, path)))
        return f"{match.group(1)}({Path(rebased).as_posix()}{hash_}{anchor})"
    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", rebase, text)


def collect() -> str:
    parts = ["# Benchmarks", "",
             "Measured on this project's machine kind (2 cores); medians and ratios from one run "
             "each. Every section names the command that wrote it; "
             "`sudo .venv/bin/python benchmarks/run_all.py` reruns them all (`make bench`). "
             "The load generator's own overhead is in [loadgen.md](loadgen.md).", ""]
    for _, section in BENCHMARKS:
        path = SECTIONS / section
        if path.exists():
            text = rebase_links(path.read_text())
            # Every heading goes one level down: the section's title becomes a second level.
            parts.append("\n".join("#" + line if line.startswith("#") else line
                                    for line in text.strip().splitlines()) + "\n")
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", action="store_true", help="only join the existing sections")
    parser.add_argument("--cold-build", action="store_true",
                        help="pass --cold-build to the sandbox benchmark (minutes)")
    args = parser.parse_args()
    if not args.collect:
        for script, _ in BENCHMARKS:
            extra = ["--cold-build"] if script == "bench_sandbox.py" and args.cold_build else []
            print(f"== {script}", flush=True)
            subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *extra], check=True)
    OUTPUT.write_text(collect())
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
