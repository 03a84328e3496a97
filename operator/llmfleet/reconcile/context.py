"""What one pass reads, built once: the object parsed, its stored status, its children sorted by
revision, the settings and the time. Every step reads the context; none parses the body or
searches the children again."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from pydantic import ValidationError

from llmfleet.api import ConditionStatus, ConditionType, InvalidSpecError, LLMDeployment, set_condition
from llmfleet.api.conditions import Condition
from llmfleet.api.status import LLMDeploymentStatus
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.render import engine_build, serving
from llmfleet.render.identity import COMPONENT_LABEL, REVISION_LABEL
from llmfleet.settings import OperatorSettings

SERVER_COMPONENT = serving.COMPONENT
# The kinds a revision serves as: a Deployment of whole replicas, or a LeaderWorkerSet of one
# group per replica spanning nodes; both count replicas (groups) in spec.replicas and
# status.readyReplicas.
SERVING_KINDS = ("Deployment", load_lws_record().kind)
BUILD_COMPONENT = engine_build.COMPONENT
# Any new value asks for a new plan without a spec change (e.g. after a catalog update).
REPLAN_ANNOTATION = "llmfleet.io/replan"
# `<verb>/<id>` (promote, abort, pause, resume, retry), written by `llmfleet rollout`.
ROLLOUT_COMMAND_ANNOTATION = "llmfleet.io/rollout-command"


def labels(obj: dict) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def object_key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def ready_replicas(workload: dict | None) -> int:
    return ((workload or {}).get("status") or {}).get("readyReplicas") or 0


@dataclass(frozen=True)
class Children:
    """The objects a deployment owns, sorted once: each revision's serving Deployment (or
    LeaderWorkerSet) and build Job; the rest (Services, ConfigMaps, routes) only matter to
    pruning, which walks them all."""

    all: tuple[dict, ...]
    serving: dict[str | None, dict]  # revision -> its serving Deployment or LeaderWorkerSet
    build_jobs: dict[str | None, dict]  # revision -> the Job filling its engine cache

    @classmethod
    def sorted_from(cls, children) -> Children:
        everything = tuple(children)
        return cls(
            everything,
            {labels(c).get(REVISION_LABEL): c for c in everything
             if c["kind"] in SERVING_KINDS and labels(c).get(COMPONENT_LABEL) == SERVER_COMPONENT},
            {labels(c).get(REVISION_LABEL): c for c in everything if c["kind"] == "Job"})

    def ready(self, revision: str | None) -> int:
        """Ready replicas of the revision's serving workload (0 when it has none)."""
        return ready_replicas(self.serving.get(revision))


@dataclass(frozen=True)
class Context:
    body: dict
    children: Children
    settings: OperatorSettings
    now: datetime

    @classmethod
    def of(cls, body: dict, children, settings: OperatorSettings, now: datetime) -> Context:
        return cls(body, Children.sorted_from(children), settings, now)

    @property
    def metadata(self) -> dict:
        return self.body["metadata"]

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def namespace(self) -> str:
        return self.metadata["namespace"]

    @property
    def generation(self) -> int | None:
        return self.metadata.get("generation")

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.get("annotations") or {}

    @property
    def replan_request(self) -> str | None:
        return self.annotations.get(REPLAN_ANNOTATION)

    @property
    def rollout_command(self) -> str | None:
        return self.annotations.get(ROLLOUT_COMMAND_ANNOTATION)

    @property
    def raw_status(self) -> dict:
        return self.body.get("status") or {}

    @cached_property
    def parsed(self) -> LLMDeployment | InvalidSpecError:
        """The typed object, or the error naming every field the models reject."""
        try:
            return LLMDeployment.from_manifest(self.body)
        except InvalidSpecError as error:
            return error

    @property
    def deployment(self) -> LLMDeployment | None:
        return self.parsed if isinstance(self.parsed, LLMDeployment) else None

    @cached_property
    def stored(self) -> LLMDeploymentStatus:
        """The stored status; empty when it no longer parses (written by an older operator)."""
        try:
            return LLMDeploymentStatus.model_validate(self.raw_status)
        except ValidationError:
            return LLMDeploymentStatus()

    @cached_property
    def conditions_before(self) -> list[Condition]:
        return list(self.stored.conditions or [])

    def condition(self, conditions: list[Condition], kind: ConditionType, status: ConditionStatus,
                  reason: str, message: str) -> list[Condition]:
        return set_condition(conditions, kind, status, reason, message, self.now, self.generation)
