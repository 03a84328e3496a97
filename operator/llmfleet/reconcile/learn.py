"""The learn step: from an observation of the settled revision's traffic, the speed fitted to
it, folded into the learned speeds, and a recommendation when a plan for the observed workload
with those speeds differs from the one served."""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmfleet.api import LLMDeploymentSpec, Reason
from llmfleet.api.status import ObservationStatus, PlanRecommendation
from llmfleet.metrics.cadence import RATE_WINDOW_SCRAPES
from llmfleet.planner.live import engine_for_plan, fit_speed_factor, learn, recommend, workload_as_observed, \
    workload_drift
from llmfleet.planner.spec_adapter import learned_speeds, model_key, plan_request_from_spec, \
    plan_status_from_plan, speed_factors_for
from llmfleet.planner.types import SpeedFactor
from llmfleet.reconcile.context import Context
from llmfleet.reconcile.events import Event
from llmfleet.reconcile.observations import Observations
from llmfleet.reconcile.plan import PlanChoice, PlanOrigin
from llmfleet.render.ttft_buckets import deployment_ttft_bounds_ms

KUBE_TIME = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class Learning:
    # The status fields it changes (observation, learned_speeds, recommendation); the rest stay.
    changes: dict
    events: tuple[Event, ...] = ()


def learn_from_traffic(ctx: Context, spec: LLMDeploymentSpec, choice: PlanChoice, revision: str,
                       observations: Observations) -> Learning:
    """A recommendation goes when the plan changes (adopted or planned anew)."""
    stored, observed = ctx.stored, observations.workload
    if choice.origin == PlanOrigin.ADOPTED:
        return Learning({"recommendation": None}, (Event.normal(
            Reason.REPLANNED, f"serving the recommended plan: {stored.recommendation.message}"),))
    if choice.origin == PlanOrigin.PLANNED:
        return Learning({"recommendation": None})
    if observed is None or choice.plan is None:
        return Learning({})
    observation = {"time": ctx.now.strftime(KUBE_TIME), "revision": revision,
                   "windowSeconds": observed.window_seconds, "requests": round(observed.requests),
                   "requestsPerSecond": round(observed.requests_per_second, 3), "replicas": observed.replicas}
    requested_seconds = ctx.settings.observation_window_seconds
    widened = (f"the {requested_seconds} s window holds fewer than {RATE_WINDOW_SCRAPES} scrapes: widened to "
               f"{observed.window_seconds} s; " if observed.window_seconds > requested_seconds else "")
    if observed.error:
        return Learning(_news(ctx, {**observation, "message": f"{widened}Prometheus: {observed.error}"[:1024]}))
    plan, fleet = choice.plan, observations.fleet.speeds
    request = plan_request_from_spec(spec, cluster_gpus=observations.fleet.gpus,
                                     learned=[*(stored.learned_speeds or ()), *fleet])
    declared, planned_peak = request.workload, stored.plan.peak_requests_per_second
    workload = workload_as_observed(declared, observed, planned_peak, longest_prompt_tokens=spec.engine.max_input_len,
                                    longest_sequence_tokens=spec.engine.max_seq_len)
    believed = request.space.speed_factor(plan.gpu_type, plan.quantization)
    fit = fit_speed_factor(engine_for_plan(request, plan), workload, observed,
                           min_requests=ctx.settings.observation_min_requests,
                           ttft_bounds_ms=deployment_ttft_bounds_ms(spec),
                           known_factor=believed.factor if believed else 1.0)
    observation.update({"ttftP99Ms": _round(observed.ttft_p99_ms, 1),
                        "inputTokensMean": _round(observed.input_tokens_mean, 1),
                        "outputTokensMean": _round(observed.output_tokens_mean, 1),
                        "prefixReuseFraction": _round(observed.prefix_reuse_fraction, 3),
                        "speedFactor": _round(fit.factor, 4), "message": (widened + fit.note)[:1024]})
    speeds = list(stored.learned_speeds or ())
    if fit.factor is not None:
        known = next((SpeedFactor(plan.gpu_type, plan.quantization, s.speed_factor, s.requests) for s in speeds
                      if (s.model, s.gpu_type.value, s.quantization.value)
                      == (model_key(spec), plan.gpu_type, plan.quantization)), None)
        speeds = learned_speeds(spec, speeds, learn(known, plan.gpu_type, plan.quantization, fit.factor,
                                                    round(observed.requests)))
    request = replace(request, workload=workload, space=replace(
        request.space, speed_factors=speed_factors_for(spec, [*speeds, *fleet])))
    drift = workload_drift(declared, observed, planned_peak)
    advice = recommend(request, plan, drift, replicas_autoscaled=spec.autoscaling.enabled)
    if drift and advice is None:
        observation["message"] = f"{observation['message']}; {'; '.join(drift)}: the served plan meets it"[:1024]
    changes = {**_news(ctx, {k: v for k, v in observation.items() if v is not None}),
               "learned_speeds": speeds or None, "recommendation": None}
    if advice is None:
        return Learning(changes)
    recommended = plan_status_from_plan(advice.plan, workload.peak_requests_per_sec)
    before = stored.recommendation
    unchanged = before is not None and before.reason == advice.reason and before.plan.summary == recommended.summary \
        and before.plan.replicas == recommended.replicas
    changes["recommendation"] = PlanRecommendation(reason=advice.reason, message=advice.message[:2048],
                                                   time=before.time if unchanged else ctx.now, plan=recommended)
    return Learning(changes, () if unchanged else (Event.normal(advice.reason, advice.message),))


def _news(ctx: Context, observation: dict) -> dict:
    """{"observation": ...} when it tells something the stored one did not (its time aside): an
    idle deployment's empty windows are not written again and again."""
    def story(observed: dict | None) -> dict:
        return {key: value for key, value in (observed or {}).items() if key != "time"}
    if story(ctx.raw_status.get("observation")) == story(observation):
        return {}
    return {"observation": ObservationStatus.model_validate(observation)}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
