"""`spec.rollout`: canary steps, promotion gates and the golden-prompt quality gate."""

from typing import Annotated

from pydantic import Field

from llmfleet.api.base import DNS_SUBDOMAIN_PATTERN, SECRET_KEY_PATTERN, ApiModel, CelRule, defaulted_model_field


class PauseStep(ApiModel):
    """Hold the canary at its current weight."""

    duration_seconds: int = Field(ge=0, le=86400, description="How long to hold, in seconds.")


class AnalysisStep(ApiModel):
    """Hold the canary and compare it with the stable revision against the gates."""

    duration_seconds: int = Field(
        ge=1, le=86400, description="How long to collect metrics, in seconds."
    )
    interval_seconds: int = Field(
        default=30, ge=5, le=3600, description="Time between gate evaluations, in seconds; each "
        "compares the canary with stable over the window since the step began."
    )


class RolloutStep(ApiModel):
    """One canary step: exactly one of setWeight, pause or analysis."""

    set_weight: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Send this percentage of traffic to the new revision.",
    )
    pause: PauseStep | None = Field(default=None, description="Wait before the next step.")
    analysis: AnalysisStep | None = Field(
        default=None, description="Evaluate the gates before the next step."
    )

    cel_rules = (
        CelRule(
            rule="(has(self.setWeight) ? 1 : 0) + (has(self.pause) ? 1 : 0) + "
            "(has(self.analysis) ? 1 : 0) == 1",
            message="spec.rollout.steps[]: each step sets exactly one of setWeight, pause or "
            "analysis",
            holds=lambda s: [s.set_weight, s.pause, s.analysis].count(None) == 2,
        ),
    )


class RolloutGates(ApiModel):
    """Limits a canary must stay within to be promoted."""

    max_ttft_p99_regression_percent: float = Field(
        default=10.0,
        ge=0,
        le=1000,
        description="Largest accepted p99 TTFT increase of the canary over stable, in percent.",
    )
    max_ttft_mean_regression_percent: float = Field(
        default=50.0,
        ge=0,
        le=1000,
        description="Largest accepted mean TTFT increase of the canary over stable, in percent. "
        "The p99 is known only to within a histogram bucket (a canary 3x slower at 10-50 ms can "
        "share neighbouring buckets with stable); the mean, from the histogram's sum, is exact.",
    )
    max_error_rate_percent: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="Largest accepted share of failed canary requests, in percent; beside a "
        "stable revision above it too, the canary's excess over stable's share. A stable revision "
        "above it holds the rollout (StableDegraded).",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        description="Fewest requests each revision must serve in an analysis window before it "
        "can pass or fail; fewer is Inconclusive and the rollout holds.",
    )
    canary_ready_deadline_seconds: int = Field(
        default=900,
        ge=10,
        le=86400,
        description="How long the canary's replicas of a step may take to become ready "
        "(scheduling, image pull, engine load) before the canary is rolled back with the reason "
        "its pods give (e.g. the scheduler's).",
    )
    analysis_deadline_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="How long past its duration an analysis step may stay without a verdict "
        "(Inconclusive: no data; Error: Prometheus down; StableDegraded: the stable revision "
        "breaches its bounds) before the rollout pauses for a person.",
    )


class ConfigMapKeyReference(ApiModel):
    """A key in a ConfigMap in the LLMDeployment's namespace."""

    name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the ConfigMap, in the same namespace as the LLMDeployment.",
    )
    key: str = Field(
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key within the ConfigMap whose value holds the prompts, one per line.",
    )


class QualityGate(ApiModel):
    """Golden prompts a new revision must answer as the stable one does, with greedy decoding:
    a faster engine that answers differently is rolled back."""

    prompts: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None, min_length=1, max_length=64, description="The golden prompts."
    )
    prompts_from: ConfigMapKeyReference | None = Field(
        default=None, description="A ConfigMap key holding the golden prompts, one per non-empty line."
    )
    max_tokens: int = Field(
        default=32, ge=1, le=1024, description="Tokens generated per prompt (greedy decoding)."
    )
    min_exact_match_percent: float = Field(
        default=90.0,
        ge=0,
        le=100,
        description="Fewest answers, in percent of prompts times canary replicas, that must equal "
        "stable's answer exactly.",
    )
    min_token_agreement_percent: float = Field(
        default=95.0,
        ge=0,
        le=100,
        description="Fewest answer tokens (whitespace-separated words, position by position), in "
        "percent, that must equal stable's.",
    )

    cel_rules = (
        CelRule(
            rule="has(self.prompts) != has(self.promptsFrom)",
            message="spec.rollout.quality: set exactly one of prompts or promptsFrom",
            holds=lambda s: (s.prompts is None) != (s.prompts_from is None),
        ),
    )


class RolloutSpec(ApiModel):
    """How a new revision (engine or plan change) replaces the current one."""

    steps: list[RolloutStep] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="Canary steps, in order. Omit to replace the revision once the new one "
        "is ready.",
    )
    gates: RolloutGates = defaulted_model_field(
        RolloutGates, "Promotion limits checked by analysis steps and throughout the canary."
    )
    quality: QualityGate | None = Field(
        default=None,
        description="Golden prompts checked on every canary replica once they are ready, before the "
        "first step; a failure rolls the canary back. Omit to skip the check.",
    )
