"""Operator settings that shape the rendered workload, and render errors."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet import __version__
from llmfleet.catalog.client_record import load_client_record


class RenderError(ValueError):
    """The deployment cannot be rendered as asked; the message says what to change."""


@dataclass(frozen=True)
class RenderSettings:
    """How the operator renders workloads; one value per operator process.

    Built engines live on a ReadWriteMany PersistentVolumeClaim in each namespace that has
    LLMDeployments: the build Job writes an entry, serving pods on any node read it. The
    operator creates the claim when it is missing and never deletes it (engines take hours
    to rebuild).
    """

    engine_cache_claim_name: str = "llmfleet-engine-cache"
    # None: the cluster's default StorageClass, which must offer ReadWriteMany.
    engine_cache_storage_class: str | None = None
    engine_cache_size: str = "500Gi"
    image_pull_secrets: tuple[str, ...] = ()
    # The image the serving pods' init container copies the Triton model code from: the pinned
    # releases' images do not ship it (no /app, catalog/releases/*.yaml), so the operator's image
    # carries tensorrtllm_backend's all_models at each pinned tag (Containerfile).
    model_code_image: str = f"llmfleet/operator:{__version__}"
    # The client that downloads an s3:// source (a mirror of it may be named instead; the
    # record, catalog/clients/*.yaml, is checked by tag).
    object_store_client_image: str = load_client_record().image
    # Finished and failed build Jobs stay for the reconciler to read: no TTL; a small retry.
    engine_build_backoff_limit: int = 1
    termination_grace_period_seconds: int = 120
    # The namespace the operator runs in (in-cluster): a rendered NetworkPolicy lets it reach
    # the serving pods for the canary's golden prompts. None outside a cluster.
    operator_namespace: str | None = None
    # The ClusterRole the endpoint pickers of spec.routing.inferencePool are bound to; the chart
    # creates one per release (<release>-endpoint-picker) and names it here.
    endpoint_picker_cluster_role: str = "llmfleet-endpoint-picker"
    # The ClusterRole the leaders of replicas spanning nodes are bound to (they read their group's
    # pods and exec its ranks into them); the chart creates <release>-rank-launcher.
    rank_launcher_cluster_role: str = "llmfleet-rank-launcher"
