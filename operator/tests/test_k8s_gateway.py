"""The gateway's translation of apiserver refusals (the writes themselves run against the
sandbox's apiserver in e2e)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ConflictError, api_exception

from llmfleet.k8s import NamespaceTerminating, WriteRefused
from llmfleet.k8s.gateway import _refusal_named, _terminating_namespace_named

SERVICE = {"kind": "Service", "metadata": {"name": "chat", "namespace": "serving"}}


def _refusal(status: int, message: str, details: dict | None = None) -> Exception:
    error = ApiException(status=status, reason="Internal Server Error")
    error.body = json.dumps({"kind": "Status", "message": message, **({"details": details} if details else {})})
    return api_exception(error)


def test_a_refused_write_names_the_object_and_quotes_the_apiserver():
    with pytest.raises(WriteRefused, match=r"^Service chat: 500 failed to allocate a serviceIP: range is full$"):
        with _refusal_named(SERVICE):
            raise _refusal(500, "failed to allocate a serviceIP: range is full")


def test_a_conflict_is_left_to_the_caller():
    with pytest.raises(ConflictError):
        with _refusal_named(SERVICE):
            raise _refusal(409, "already exists")


# As the apiserver answers a write into a namespace being deleted, and into one already gone.
TERMINATING = (403, 'configmaps "chat" is forbidden: unable to create new content in namespace serving because it '
               'is being terminated', {"name": "chat", "kind": "configmaps",
                                      "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]})
GONE = (404, 'namespaces "serving" not found', {"name": "serving", "kind": "namespaces"})


@pytest.mark.parametrize("refusal", [TERMINATING, GONE], ids=["terminating", "gone"])
def test_a_write_into_a_namespace_going_or_gone_says_so(refusal):
    with pytest.raises(NamespaceTerminating, match="^serving$"):
        with _refusal_named(SERVICE), _terminating_namespace_named("serving"):
            raise _refusal(*refusal)


def test_a_missing_object_in_a_namespace_that_exists_is_a_refused_write():
    with pytest.raises(WriteRefused):
        with _refusal_named(SERVICE), _terminating_namespace_named("serving"):
            raise _refusal(404, 'services "chat" not found', {"name": "chat", "kind": "services"})
