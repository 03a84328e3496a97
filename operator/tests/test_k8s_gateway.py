"""The gateway's translation of apiserver refusals (the writes themselves run against the
sandbox's apiserver in e2e)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ConflictError, api_exception

from llmfleet.k8s import WriteRefused
from llmfleet.k8s.gateway import _refusal_named

SERVICE = {"kind": "Service", "metadata": {"name": "chat", "namespace": "serving"}}


def _refusal(status: int, message: str) -> Exception:
    error = ApiException(status=status, reason="Internal Server Error")
    error.body = json.dumps({"kind": "Status", "message": message})
    return api_exception(error)


def test_a_refused_write_names_the_object_and_quotes_the_apiserver():
    with pytest.raises(WriteRefused, match=r"^Service chat: 500 failed to allocate a serviceIP: range is full$"):
        with _refusal_named(SERVICE):
            raise _refusal(500, "failed to allocate a serviceIP: range is full")


def test_a_conflict_is_left_to_the_caller():
    with pytest.raises(ConflictError):
        with _refusal_named(SERVICE):
            raise _refusal(409, "already exists")
