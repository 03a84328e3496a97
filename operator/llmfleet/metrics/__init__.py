"""The only module that talks to Prometheus (see test_layering); `cadence` is its pure part."""

from llmfleet.metrics.cadence import MetricsWindows, ScrapeCadence, metrics_windows
from llmfleet.metrics.prometheus import DeploymentQueries, PrometheusMetrics, deployment_queries

__all__ = ["DeploymentQueries", "MetricsWindows", "PrometheusMetrics", "ScrapeCadence", "deployment_queries",
           "metrics_windows"]
