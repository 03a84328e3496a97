"""The only module that talks to Prometheus (see test_layering)."""

from llmfleet.metrics.prometheus import (
    DEFAULT_WINDOW_SECONDS,
    DeploymentQueries,
    PrometheusMetrics,
    deployment_queries,
)

__all__ = ["DEFAULT_WINDOW_SECONDS", "DeploymentQueries", "PrometheusMetrics", "deployment_queries"]
