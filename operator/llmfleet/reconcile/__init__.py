"""One level-based pipeline for every LLMDeployment event and timer tick, a module per step:

    context   the object parsed, its stored status and children sorted by revision, once
    due       what the pass must read now (pure questions; the ticker asks them too)
    observe   all of the pass's reads (Prometheus, pods, golden prompts) into one value
    probes    the slow reads (golden prompts, canary analysis) run off the pass
    decide    the pure pipeline: validate -> plan -> learn -> build -> scale -> canary
              -> render -> roll out and prune -> conditions -> status, diffed -> events
    run       observe, decide, write; status only on change, only from the version read
"""

from llmfleet.reconcile.context import REPLAN_ANNOTATION, ROLLOUT_COMMAND_ANNOTATION, Children, Context
from llmfleet.reconcile.decide import decide
from llmfleet.reconcile.due import needs_periodic_pass, observation_due
from llmfleet.reconcile.observations import Fleet, Observations
from llmfleet.reconcile.probes import AskNow, Probes
from llmfleet.reconcile.run import reconcile
from llmfleet.reconcile.status import Outcome
from llmfleet.settings import OperatorSettings

__all__ = [
    "REPLAN_ANNOTATION", "ROLLOUT_COMMAND_ANNOTATION", "AskNow", "Children", "Context", "Fleet", "Observations",
    "OperatorSettings", "Outcome", "Probes", "decide", "needs_periodic_pass", "observation_due", "reconcile",
]
