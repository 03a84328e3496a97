"""The only package that talks to the Kubernetes API."""

from llmfleet.k8s.gateway import (
    APISERVER_REFUSALS,
    KubeGateway,
    NamespaceTerminating,
    ObjectGone,
    WriteRefused,
    load_api_client,
)
from llmfleet.render.identity import CHILD_KINDS

__all__ = ["APISERVER_REFUSALS", "CHILD_KINDS", "KubeGateway", "NamespaceTerminating", "ObjectGone", "WriteRefused", "load_api_client"]
