"""The only package that talks to the Kubernetes API."""

from llmfleet.k8s.gateway import CHILD_KINDS, KubeGateway, load_api_client

__all__ = ["CHILD_KINDS", "KubeGateway", "load_api_client"]
