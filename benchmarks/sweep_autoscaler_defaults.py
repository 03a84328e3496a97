"""Choose the autoscaler's defaults in simulation, then check them on traffic never read while
choosing (issue 30 part 6).

`llmfleet simulate`'s engine, Prometheus and operator (llmfleet.simulation) serve the TUNING
traffic under every candidate setting of spec.autoscaling, at the 15 s and 30 s scrape intervals
users run, over three seeds (arrivals, lengths and each pod's scrape phase). Goals per run, the
issue's: at least 99.5 % of requests within the SLO's p99 TTFT, no reversal, and where the
traffic rises and falls, at most 60 % of the replica-seconds of a static fleet sized for its
peak (the fewest replicas that serve it with 99.5 % within the SLO, found by simulating static
fleets). Candidates are searched one setting at a time from today's defaults (coordinate
descent, two rounds); a candidate's score is the runs meeting every goal, then its mean
attainment (to a tenth of a point), then its replica-seconds. Every candidate's score goes to the log.

Then the chosen setting and today's defaults serve the CHECK traffic once each: other seeds,
shapes the tuning never saw, and a stretch of Mooncake's public conversation trace that the
tuning never read (benchmarks/data/mooncake_conversation.md says which stretch is which).
Prints markdown, writes docs/benchmarks/autoscaler-defaults.md, appends to its log.
Run: .venv/bin/python benchmarks/sweep_autoscaler_defaults.py [--jobs 2]   (about 30 minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from argparse import Namespace
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sandbox import append_run, commit  # noqa: E402

from llmfleet.api import AutoscalingSpec, LLMDeployment  # noqa: E402
from llmfleet.autoscale.policy import DEFAULT_TARGET_SHARE_OF_SLO  # noqa: E402
from llmfleet.catalog import load_catalog  # noqa: E402
from llmfleet.cli.inputs import read_mapping  # noqa: E402
from llmfleet.metrics.cadence import MIN_RATE_WINDOW_SECONDS, RATE_WINDOW_SCRAPES  # noqa: E402
from llmfleet.loadgen.command import length_distributions, open_loop_plan  # noqa: E402
from llmfleet.planner import plan  # noqa: E402
from llmfleet.planner.spec_adapter import plan_request_from_spec  # noqa: E402
from llmfleet.simulation.deployment import exported_queue_series, fleet_for  # noqa: E402
from llmfleet.simulation.fleet import Fleet, FleetSettings, simulate  # noqa: E402
from llmfleet.simulation.replica import Arrival  # noqa: E402

REPORT = REPO / "docs" / "benchmarks" / "autoscaler-defaults.md"
LOG = REPO / "docs" / "benchmarks" / "autoscaler-defaults-log.md"
MOONCAKE = REPO / "benchmarks" / "data" / "mooncake_conversation.jsonl"
DEMO_SPEC = REPO / "examples" / "sandbox-chat.yaml"

ATTAINMENT_GOAL_PERCENT = 99.5
REPLICA_SECONDS_SHARE_GOAL = 0.60
SCRAPE_INTERVALS_S = (15.0, 30.0)
TUNING_SEEDS = (0, 1, 2)
CHECK_SEEDS = (100, 101, 102)
RECONCILE_INTERVAL_S = 5.0
START_UP_DELAY_S = 8.0  # the sandbox's, as `llmfleet simulate` defaults
MOST_STATIC_REPLICAS = 8
DESCENT_ROUNDS = 2


# --- deployments -------------------------------------------------------------------------------

def _small_batch_70b() -> dict:
    """bench_autoscaling's deployment: Llama 3.1 70B on one H100, a 4-sequence batch (about 3.5
    requests/s of 128-token prompts and 32-token answers a replica), SLO p99 TTFT 500 ms."""
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "climb", "namespace": "sweep"},
            "spec": {"model": {"name": "llama-3.1-70b"},
                     "engine": {"runtime": "engine", "maxBatchSize": 4, "maxInputLen": 1024, "maxSeqLen": 2048,
                                "maxNumTokens": 2048},
                     "slo": {"ttftP99Ms": 500, "tpotP99Ms": 50,
                             "quality": {"allowedQuantizations": ["BF16", "FP8"]}},
                     "workload": {"inputTokensMean": 128, "inputTokensP99": 256, "outputTokensMean": 32,
                                  "outputTokensP99": 64, "peakRequestsPerSecond": 0.5},
                     "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
                     # Room for the static fleet the peaks need with connections spread at random.
                     "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8}}}


def _conversation_8b() -> dict:
    """bench_simulate_vs_live's deployment for Mooncake's conversation trace: Llama 3.1 8B,
    prompts of 12k tokens on average, SLO p99 TTFT 3 s."""
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "conversation", "namespace": "sweep"},
            "spec": {"model": {"name": "llama-3.1-8b"},
                     "engine": {"runtime": "engine", "maxInputLen": 131072, "maxSeqLen": 133120},
                     "slo": {"ttftP99Ms": 3000, "tpotP99Ms": 50},
                     "workload": {"inputTokensMean": 12000, "inputTokensP99": 85000, "outputTokensMean": 343,
                                  "outputTokensP99": 1120, "peakRequestsPerSecond": 1},
                     "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
                     "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4}}}


def _demo() -> dict:
    return read_mapping(str(DEMO_SPEC), f"-f {DEMO_SPEC}")


DEPLOYMENTS = {"70B, 4-sequence batch": _small_batch_70b, "the demo (examples/sandbox-chat.yaml)": _demo,
               "8B, Mooncake lengths": _conversation_8b}


# --- traffic -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    name: str
    deployment: str  # a key of DEPLOYMENTS
    # A `llmfleet load` schedule with its length and token distributions, or a stretch of the
    # Mooncake trace (start and end, s).
    schedule: str | None = None
    duration_s: float = 0.0
    input_tokens: str = "lognormal:128:256"
    output_tokens: str = "lognormal:32:64"
    trace_stretch_s: tuple[float, float] | None = None
    # Whether the traffic rises and falls, so that autoscaling can save replica-seconds (the
    # 60 % goal); a plateau or a flat production hour is held to attainment and reversals only.
    varies: bool = True

    def arrivals(self, seed: int) -> list[Arrival]:
        if self.trace_stretch_s is not None:
            return _mooncake_stretch(*self.trace_stretch_s)
        args = Namespace(trace=None, schedule=self.schedule, duration_s=self.duration_s, seed=seed,
                         input_tokens=self.input_tokens, output_tokens=self.output_tokens)
        requests, _ = open_loop_plan(args, *length_distributions(args))
        return [Arrival(request.arrival_s * 1000, request.input_tokens, request.output_tokens) for request in requests]


@cache
def _mooncake_rows() -> tuple[dict, ...]:
    return tuple(json.loads(line) for line in MOONCAKE.read_text().splitlines())


def _mooncake_stretch(start_s: float, end_s: float) -> list[Arrival]:
    return [Arrival((row["arrival_s"] - start_s) * 1000, row["input_tokens"], row["output_tokens"])
            for row in _mooncake_rows() if start_s <= row["arrival_s"] < end_s]


SMALL = "70B, 4-sequence batch"
TUNING = (
    Traffic("steep climb", SMALL, "ramp:0:0.5,60:0.5,120:6,180:6,240:0.5", 420),
    Traffic("steps", SMALL, "steps:0:1,90:5,270:1", 420),
    Traffic("slow day", SMALL, "ramp:0:0.5,300:6,600:6,900:0.5", 900),
    Traffic("bursts", SMALL, "steps:0:1,60:5,90:1,150:5,180:1,240:5,270:1", 420),
    Traffic("plateau", SMALL, "constant:3", 420, varies=False),
    Traffic("the demo's printed load", "the demo (examples/sandbox-chat.yaml)", "steps:0:1,60:3,240:1", 360,
            "lognormal:256:512", "lognormal:64:128"),
    Traffic("Mooncake conversation 300-1200 s", "8B, Mooncake lengths", trace_stretch_s=(300.0, 1200.0),
            varies=False),
)
CHECK = (
    *(dataclasses.replace(traffic, name=f"{traffic.name}, other seeds") for traffic in TUNING
      if traffic.trace_stretch_s is None),
    Traffic("two peaks", SMALL, "ramp:0:0.5,60:4,120:1,180:6,240:6,300:0.5", 480),
    Traffic("a long rise and a cliff", SMALL, "ramp:0:0.5,400:5,401:0.5", 600),
    Traffic("the demo, a sharper step", "the demo (examples/sandbox-chat.yaml)", "steps:0:0.5,60:4,200:0.5", 360,
            "lognormal:256:512", "lognormal:64:128"),
    Traffic("Mooncake conversation 1800-3537 s", "8B, Mooncake lengths", trace_stretch_s=(1800.0, 3600.0),
            varies=False),
)


# --- candidates --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """The settings swept: spec.autoscaling's, and the share of the way from the prefill floor to
    the SLO that an unset targetTtftP99Ms steers to (policy.DEFAULT_TARGET_SHARE_OF_SLO)."""

    target_share: float
    rate_forecast_seconds: int
    scale_down_stabilization_seconds: int
    cooldown_seconds: int
    tolerance_percent: float
    max_scale_up_step: int
    # The query window in scrape intervals, at least MIN_RATE_WINDOW_SECONDS
    # (metrics.cadence.RATE_WINDOW_SCRAPES): not an API setting, the operator's constant.
    window_scrapes: int

    def describe(self) -> str:
        return (f"target {self.target_share:.0%} of the way to the SLO, forecast {self.rate_forecast_seconds} s, "
                f"scale-down window {self.scale_down_stabilization_seconds} s, cooldown {self.cooldown_seconds} s, "
                f"tolerance {self.tolerance_percent:g} %, up to {self.max_scale_up_step} added at once, "
                f"window {self.window_scrapes} scrapes")

    def window_seconds(self, scrape_interval_s: float) -> int:
        return max(MIN_RATE_WINDOW_SECONDS, math.ceil(self.window_scrapes * scrape_interval_s))


_API = AutoscalingSpec()
TODAY = Candidate(DEFAULT_TARGET_SHARE_OF_SLO, _API.rate_forecast_seconds, _API.scale_down_stabilization_seconds,
                  _API.cooldown_seconds, _API.tolerance_percent, _API.max_scale_up_step, RATE_WINDOW_SCRAPES)
SEARCH = {
    "target_share": (0.4, 0.5, 0.6, 0.7),
    "rate_forecast_seconds": (0, 15, 30, 60),
    "scale_down_stabilization_seconds": (60, 120, 180, 300),
    "cooldown_seconds": (0, 30, 60, 120),
    "tolerance_percent": (5.0, 10.0, 20.0),
    "max_scale_up_step": (2, 4, 8),
    "window_scrapes": (3, 4, 6),
}


@cache
def _planned(deployment: str):
    resource = LLMDeployment.model_validate(DEPLOYMENTS[deployment]())
    spec = resource.spec
    catalog = load_catalog()
    result = plan(plan_request_from_spec(spec, catalog=catalog))
    assert result.feasible, f"{deployment}: no plan"
    return spec, result, catalog


def fleet_for_candidate(deployment: str, candidate: Candidate | None, static_replicas: int | None = None) -> Fleet:
    """The deployment's fleet autoscaled with the candidate's settings, or static at a count."""
    spec, result, catalog = _planned(deployment)
    if candidate is None:
        fleet = fleet_for(spec.model_copy(update={"autoscaling": AutoscalingSpec()}), result, catalog)
        return dataclasses.replace(fleet, initial_replicas=static_replicas, autoscaling=None, capacity=None)
    floor_ms = fleet_for(spec, result, catalog).capacity.prefill_ttft_p99_ms
    slo_ms = spec.slo.ttft_p99_ms
    autoscaling = spec.autoscaling.model_copy(update={
        "target_ttft_p99_ms": max(1, round(floor_ms + (slo_ms - floor_ms) * candidate.target_share)),
        "rate_forecast_seconds": candidate.rate_forecast_seconds,
        "scale_down_stabilization_seconds": candidate.scale_down_stabilization_seconds,
        "cooldown_seconds": candidate.cooldown_seconds, "tolerance_percent": candidate.tolerance_percent,
        "max_scale_up_step": candidate.max_scale_up_step})
    return fleet_for(spec.model_copy(update={"autoscaling": autoscaling}), result, catalog)


# --- runs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    traffic: Traffic
    seed: int
    scrape_interval_s: float


@dataclass(frozen=True)
class Outcome:
    attainment_percent: float
    replica_seconds: float
    reversals: int
    static_replica_seconds: float  # the static fleet sized for the peak

    @property
    def share_of_static(self) -> float:
        return self.replica_seconds / self.static_replica_seconds

    def meets(self, traffic: Traffic) -> bool:
        return (self.attainment_percent >= ATTAINMENT_GOAL_PERCENT and self.reversals == 0
                and (not traffic.varies or self.share_of_static <= REPLICA_SECONDS_SHARE_GOAL))


def _settings(run: Run, candidate: Candidate = TODAY) -> FleetSettings:
    spec, _, _ = _planned(run.traffic.deployment)
    return FleetSettings(scrape_interval_seconds=run.scrape_interval_s,
                         window_seconds=candidate.window_seconds(run.scrape_interval_s),
                         reconcile_interval_seconds=RECONCILE_INTERVAL_S, start_up_delay_seconds=START_UP_DELAY_S,
                         seed=run.seed, **exported_queue_series(spec))


def _attainment(fleet_run, slo_ms: float) -> float:
    met = sum(1 for request in fleet_run.requests if request.failure is None and request.ttft_ms <= slo_ms)
    return 100.0 * met / len(fleet_run.requests)


@cache
def static_replica_seconds(traffic: Traffic, seed: int) -> float:
    """Replica-seconds of the fewest static replicas that serve the traffic within the goal."""
    arrivals = traffic.arrivals(seed)
    slo_ms = _planned(traffic.deployment)[0].slo.ttft_p99_ms
    for replicas in range(1, MOST_STATIC_REPLICAS + 1):
        fleet_run = simulate(fleet_for_candidate(traffic.deployment, None, replicas),
                             _settings(Run(traffic, seed, SCRAPE_INTERVALS_S[0])), arrivals)
        if _attainment(fleet_run, slo_ms) >= ATTAINMENT_GOAL_PERCENT:
            return replicas * fleet_run.end_s
    raise AssertionError(f"{traffic.name}: {MOST_STATIC_REPLICAS} static replicas do not serve it")


def serve(candidate: Candidate, run: Run) -> Outcome:
    fleet_run = simulate(fleet_for_candidate(run.traffic.deployment, candidate), _settings(run, candidate),
                         run.traffic.arrivals(run.seed))
    slo_ms = _planned(run.traffic.deployment)[0].slo.ttft_p99_ms
    return Outcome(_attainment(fleet_run, slo_ms), fleet_run.replica_seconds(), fleet_run.reversals(),
                   static_replica_seconds(run.traffic, run.seed))


def _serve_star(job: tuple[Candidate, Run]) -> Outcome:
    return serve(*job)


def runs_of(traffics: Sequence[Traffic], seeds: Sequence[int]) -> list[Run]:
    return [Run(traffic, seed, interval) for traffic in traffics for seed in seeds for interval in SCRAPE_INTERVALS_S]


@dataclass(frozen=True)
class Score:
    candidate: Candidate
    outcomes: tuple[tuple[Run, Outcome], ...]

    @property
    def met(self) -> int:
        return sum(outcome.meets(run.traffic) for run, outcome in self.outcomes)

    @property
    def worst_attainment(self) -> float:
        return min(outcome.attainment_percent for _, outcome in self.outcomes)

    @property
    def mean_attainment(self) -> float:
        return sum(outcome.attainment_percent for _, outcome in self.outcomes) / len(self.outcomes)

    @property
    def replica_seconds(self) -> float:
        return sum(outcome.replica_seconds for _, outcome in self.outcomes)

    @property
    def reversals(self) -> int:
        return sum(outcome.reversals for _, outcome in self.outcomes)

    def key(self) -> tuple:
        # Where no setting meets a run's goals (a step the scrape interval sees too late), the
        # worst run ties them all; the mean attainment still tells them apart.
        return (self.met, round(self.mean_attainment, 1), -self.replica_seconds)


def score(pool: ProcessPoolExecutor, candidate: Candidate, runs: Sequence[Run]) -> Score:
    return Score(candidate, tuple(zip(runs, pool.map(_serve_star, [(candidate, run) for run in runs]))))


def coordinate_descent(pool: ProcessPoolExecutor, runs: Sequence[Run], start: Candidate,
                       on_score) -> Score:
    """From `start`, each setting in turn set to its best value with the others held; two rounds."""
    seen: dict[Candidate, Score] = {}

    def scored(candidate: Candidate) -> Score:
        if candidate not in seen:
            seen[candidate] = score(pool, candidate, runs)
            on_score(seen[candidate])
        return seen[candidate]

    best = scored(start)
    for _ in range(DESCENT_ROUNDS):
        for setting, values in SEARCH.items():
            for value in values:
                candidate = dataclasses.replace(best.candidate, **{setting: value})
                if scored(candidate).key() > best.key():
                    best = scored(candidate)
    return best


# --- report ------------------------------------------------------------------------------------

def _rows(label: str, score_: Score) -> Iterable[str]:
    by_traffic: dict[str, list[tuple[Run, Outcome]]] = {}
    for run, outcome in score_.outcomes:
        by_traffic.setdefault(run.traffic.name, []).append((run, outcome))
    for name, pairs in by_traffic.items():
        for interval in SCRAPE_INTERVALS_S:
            at = [(run, outcome) for run, outcome in pairs if run.scrape_interval_s == interval]
            attainments = [outcome.attainment_percent for _, outcome in at]
            shares = [outcome.share_of_static for _, outcome in at]
            met = sum(outcome.meets(run.traffic) for run, outcome in at)
            yield (f"| {label} | {name} | {interval:g} s | {min(attainments):.2f}-{max(attainments):.2f}% | "
                   f"{min(shares):.0%}-{max(shares):.0%}{'' if at[0][0].traffic.varies else ' (not held)'} | "
                   f"{sum(outcome.reversals for _, outcome in at)} | {met}/{len(at)} |")


TABLE_HEAD = ("| setting | traffic | scrape | within SLO (min-max over seeds) | replica-seconds / static peak "
              "| reversals | runs meeting every goal |\n|---|---|---|---|---|---:|---|")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="simulations at once (default 2)")
    args = parser.parse_args()
    started = time.monotonic()
    measured = commit()
    tuning_runs = runs_of(TUNING, TUNING_SEEDS)
    check_runs = runs_of(CHECK, CHECK_SEEDS)
    tried: list[Score] = []

    def on_score(score_: Score) -> None:
        tried.append(score_)
        print(f"[{time.monotonic() - started:6.0f} s] {score_.met}/{len(score_.outcomes)} met, mean "
              f"{score_.mean_attainment:.2f} %, worst {score_.worst_attainment:.2f} %, "
              f"{score_.replica_seconds:,.0f} replica-s, {score_.reversals} "
              f"reversals: {score_.candidate.describe()}", file=sys.stderr, flush=True)

    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        best = coordinate_descent(pool, tuning_runs, TODAY, on_score)
        today_tuning = next(s for s in tried if s.candidate == TODAY)
        check_today = score(pool, TODAY, check_runs)
        check_best = check_today if best.candidate == TODAY else score(pool, best.candidate, check_runs)

    lines = [
        "## Choosing the autoscaler's defaults in simulation",
        "",
        f"Generated by `.venv/bin/python benchmarks/sweep_autoscaler_defaults.py` at commit {measured}: "
        f"{len(tried)} settings of spec.autoscaling, each serving the tuning traffic in `llmfleet simulate`'s "
        f"engine, Prometheus and operator at the {' and '.join(f'{s:g} s' for s in SCRAPE_INTERVALS_S)} scrape "
        f"intervals over seeds {', '.join(map(str, TUNING_SEEDS))} ({len(tuning_runs)} runs each); goals per run "
        f"(issue 30): at least {ATTAINMENT_GOAL_PERCENT} % within the SLO's p99 TTFT, no reversal, and on traffic "
        f"that rises and falls at most {REPLICA_SECONDS_SHARE_GOAL:.0%} of the replica-seconds of the fewest static "
        "replicas that serve it within the goal. Searched one setting at a time from today's defaults "
        f"({DESCENT_ROUNDS} rounds). Machine: 2 cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}, {time.monotonic() - started:,.0f} s. Every setting tried: "
        "[autoscaler-defaults-log.md](autoscaler-defaults-log.md).",
        "",
        f"- today's defaults: {TODAY.describe()}: tuning {today_tuning.met}/{len(tuning_runs)} runs met "
        f"(mean {today_tuning.mean_attainment:.2f} % within the SLO); check {check_today.met}/{len(check_runs)} "
        f"(mean {check_today.mean_attainment:.2f} %)",
        f"- chosen: {best.candidate.describe()}: tuning {best.met}/{len(tuning_runs)} "
        f"(mean {best.mean_attainment:.2f} %); check {check_best.met}/{len(check_runs)} "
        f"(mean {check_best.mean_attainment:.2f} %, read once, after choosing)",
        "",
        TABLE_HEAD,
        *_rows("today's", today_tuning), *_rows("chosen", best),
        "",
        "Check traffic (other seeds, new shapes, a stretch of the Mooncake trace the tuning never read):",
        "",
        TABLE_HEAD,
        *_rows("today's", check_today), *_rows("chosen", check_best),
        "",
    ]
    report = "\n".join(lines)
    print(report)
    REPORT.write_text(report)
    for label, score_ in [("tuning", s) for s in tried] + [("check, today's", check_today),
                                                            ("check, chosen", check_best)]:
        append_run(LOG, "| when | commit | traffic | setting | runs meeting every goal | mean within SLO | worst | "
                   "replica-seconds | reversals |\n|---|---|---|---|---:|---:|---:|---:|---:|\n",
                   f"| {time.strftime('%Y-%m-%d %H:%M')} | {measured} | {label} | {score_.candidate.describe()} | "
                   f"{score_.met}/{len(score_.outcomes)} | {score_.mean_attainment:.2f}% | "
                   f"{score_.worst_attainment:.2f}% | {score_.replica_seconds:,.0f} | {score_.reversals} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
