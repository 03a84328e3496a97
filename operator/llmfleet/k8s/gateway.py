"""Server-side apply, prune, status patches and events for LLMDeployments."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
from http import HTTPStatus

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, DynamicApiError, ForbiddenError, NotFoundError
from urllib3.util.retry import Retry

from llmfleet.api import API_VERSION, GROUP, KIND, PLURAL, VERSION

FIELD_MANAGER = "llmfleet"
EVENT_SOURCE = "llmfleet-operator"

log = logging.getLogger(__name__)


class NamespaceTerminating(Exception):
    """The namespace is being deleted or is gone: nothing new can be created in it, and its
    objects go."""


class ObjectGone(Exception):
    """The LLMDeployment's status patch found no object (404): it was deleted while a pass ran
    on its last copy, or an index still holds it after its namespace went (a watch by
    namespace pattern stops before it reports the objects' deletion)."""


class WriteRefused(Exception):
    """The apiserver refused to write a child or a status (the Service range full, a webhook, a
    quota, throttling that outlasted the retries...): which object, and the apiserver's own words."""


# What a request the apiserver answered with a refusal raises: the pass's failure is the
# cluster's doing (throttling past the retries, a webhook, a quota), not a bug of the operator.
APISERVER_REFUSALS = (WriteRefused, ApiException)


@contextlib.contextmanager
def _refusal_named(manifest: dict):
    try:
        yield
    except ConflictError:
        raise  # the object exists (ensure) or is being replaced: the caller knows what to do
    except DynamicApiError as error:
        try:
            said = json.loads(error.body).get("message") or error.reason
        except (TypeError, ValueError):
            said = error.reason
        raise WriteRefused(f"{manifest['kind']} {manifest['metadata']['name']}: {error.status} {said}") from error


def _details(error: DynamicApiError) -> dict:
    try:
        return json.loads(error.body).get("details") or {}
    except (TypeError, ValueError, AttributeError):
        return {}


@contextlib.contextmanager
def _terminating_namespace_named(namespace: str):
    """Turns the apiserver's refusal to create in a namespace being deleted, or already gone,
    into NamespaceTerminating. Gone happens to an operator watching namespaces by pattern: the
    watch of a deleted namespace stops before it reports its objects' deletion, so they stay
    in the indexes."""
    try:
        yield
    except ForbiddenError as error:
        if any(cause.get("reason") == "NamespaceTerminating" for cause in _details(error).get("causes") or []):
            raise NamespaceTerminating(namespace) from None
        raise
    except NotFoundError as error:
        details = _details(error)
        if details.get("kind") == "namespaces" and details.get("name") == namespace:
            raise NamespaceTerminating(namespace) from None
        raise




def _object_key(obj: dict) -> tuple[str, str, str]:
    metadata = obj["metadata"]
    return obj["kind"], metadata.get("namespace", ""), metadata["name"]


def _digest(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _fingerprint(obj: dict) -> str:
    """What changes when anyone changes the object's desired state: its generation where the
    kind keeps one (status updates leave it alone), else its resourceVersion."""
    metadata = obj.get("metadata") or {}
    generation = metadata.get("generation")
    return f"generation {generation}" if generation else f"version {metadata.get('resourceVersion')}"


# client-go sends again, up to 10 times, a request the apiserver answered 429 (API Priority
# and Fairness refused it a seat), after the Retry-After it names (or a back-off of at most a
# second): such a request was never executed, so every verb may be sent again. A failure to
# connect is retried as urllib3's default does; a lost answer never is (a POST may have run).
THROTTLED_RETRIES = 10
THROTTLED_BACKOFF_MAX_S = 1.0
CONNECT_RETRIES = 3


class ThrottlingRetry(Retry):
    """Says when the apiserver throttled a request that is sent again: an operator slowed by
    API Priority and Fairness should show why (urllib3 logs it only at debug level)."""

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):
        retry = super().increment(method, url, response, error, _pool, _stacktrace)
        if response is not None and response.status == HTTPStatus.TOO_MANY_REQUESTS:
            log.info("the apiserver throttled %s %s (429, Retry-After: %s s); sending it again (%d of %d)",
                     method, url, response.headers.get("Retry-After", "none"),
                     THROTTLED_RETRIES - retry.status, THROTTLED_RETRIES)
        return retry


def throttling_retry() -> Retry:
    return ThrottlingRetry(total=THROTTLED_RETRIES + CONNECT_RETRIES, connect=CONNECT_RETRIES, read=0, redirect=0,
                 status=THROTTLED_RETRIES, status_forcelist=(HTTPStatus.TOO_MANY_REQUESTS,), allowed_methods=None,
                 respect_retry_after_header=True, backoff_factor=0.25, backoff_max=THROTTLED_BACKOFF_MAX_S,
                 raise_on_status=False)


def _load_config(kubeconfig: str | None) -> None:
    """In-cluster config when running in a pod, else the kubeconfig (or $KUBECONFIG)."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return
        except config.ConfigException:
            pass
    config.load_kube_config(config_file=kubeconfig)


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    _load_config(kubeconfig)
    configuration = client.Configuration.get_default_copy()
    configuration.retries = throttling_retry()
    return client.ApiClient(configuration)


class KubeGateway:
    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client
        self.dynamic = DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self._resources = {}
        # Objects known to exist: ensure() asks the API once per object and operator process.
        self._ensured: set[tuple[str, str, str]] = set()
        # What this process last applied to each child, and the child's fingerprint after it.
        self._applied: dict[tuple[str, str, str], tuple[str, str]] = {}

    def _resource(self, api_version: str, kind: str):
        key = (api_version, kind)
        if key not in self._resources:
            self._resources[key] = self.dynamic.resources.get(api_version=api_version, kind=kind)
        return self._resources[key]

    # -- children -------------------------------------------------------------------------

    def apply(self, manifest: dict, live: dict | None = None) -> None:
        """Server-side apply as field manager `llmfleet`, taking over conflicting fields; skipped
        when `live` (the object as last seen) is unchanged since this process applied the same
        manifest, so that a settled deployment costs no writes. A child changed by anyone else,
        or deleted, is applied again. Raises NamespaceTerminating when the namespace is being
        deleted or is gone."""
        key, digest = _object_key(manifest), _digest(manifest)
        if live is not None and self._applied.get(key) == (digest, _fingerprint(live)):
            return
        resource = self._resource(manifest["apiVersion"], manifest["kind"])
        metadata = manifest["metadata"]
        with _refusal_named(manifest), _terminating_namespace_named(metadata.get("namespace", "")):
            applied = resource.server_side_apply(
                body=manifest, name=metadata["name"], namespace=metadata.get("namespace"),
                field_manager=FIELD_MANAGER, force_conflicts=True)
        self._applied[key] = (digest, _fingerprint(applied.to_dict()))

    def scale(self, child: dict, replicas: int) -> None:
        """Set a child's spec.replicas alone (a merge patch, as an autoscaler writes it), leaving
        the rest of the object as it was applied."""
        resource = self._resource(child["apiVersion"], child["kind"])
        metadata = child["metadata"]
        with _refusal_named(child):
            resource.patch(body={"spec": {"replicas": replicas}}, name=metadata["name"],
                           namespace=metadata["namespace"], content_type="application/merge-patch+json",
                           field_manager=FIELD_MANAGER)

    def ensure(self, manifest: dict) -> None:
        """Create the object unless it exists; never change or take over an existing one (a
        user may have created the engine cache claim with their own storage class)."""
        metadata = manifest["metadata"]
        key = (manifest["kind"], metadata.get("namespace", ""), metadata["name"])
        if key in self._ensured:
            return
        resource = self._resource(manifest["apiVersion"], manifest["kind"])
        try:
            with _refusal_named(manifest), _terminating_namespace_named(metadata.get("namespace", "")):
                resource.create(body=manifest, namespace=metadata.get("namespace"), field_manager=FIELD_MANAGER)
        except ConflictError:
            pass  # it exists
        self._ensured.add(key)

    def delete(self, child: dict) -> None:
        resource = self._resource(child["apiVersion"], child["kind"])
        metadata = child["metadata"]
        self._applied.pop(_object_key(child), None)
        try:
            resource.delete(name=metadata["name"], namespace=metadata["namespace"],
                            body={"propagationPolicy": "Background"})
        except NotFoundError:
            pass

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return self.api_client.sanitize_for_serialization(pods)["items"]

    def list_cluster(self) -> tuple[list[dict], list[dict], list[dict]]:
        """Every node, every pod not finished and every LLMDeployment: `llmfleet fleet status`."""
        serialize = self.api_client.sanitize_for_serialization
        nodes = serialize(self.core.list_node())["items"]
        pods = serialize(self.core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed"))["items"]
        deployments = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        return nodes, pods, deployments

    def config_map_value(self, namespace: str, name: str, key: str) -> str | None:
        """One key of a ConfigMap; None when the ConfigMap or the key does not exist."""
        try:
            config_map = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return (config_map.data or {}).get(key)

    # -- the LLMDeployment itself ---------------------------------------------------------

    def annotate_llm_deployment(self, namespace: str, name: str, key: str, value: str) -> None:
        """Set one annotation (a merge patch: the spec and other annotations stay)."""
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": {key: value}}})

    def get_llm_deployment(self, namespace: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict, resource_version: str | None = None) -> bool:
        """One merge patch of the status subresource; lists in it replace the old ones. With
        `resource_version`, only if the object is still at that version: False when it has
        changed since (the pass worked from a stale copy; the next pass sees the new one).
        Raises ObjectGone when the object is not there."""
        patch = {"status": status}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, patch, _content_type="application/merge-patch+json")
        except ApiException as error:
            if error.status == 409:
                return False
            if error.status == 404:
                raise ObjectGone(f"{namespace}/{name}") from None
            raise WriteRefused(f"status of {namespace}/{name}: {error.status} {error.reason}") from error
        return True

    def emit_event(self, body: dict, event_type: str, reason: str, message: str) -> None:
        metadata = body["metadata"]
        now = datetime.datetime.now(datetime.timezone.utc)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{metadata['name']}."),
            involved_object=client.V1ObjectReference(
                api_version=API_VERSION, kind=KIND, name=metadata["name"],
                namespace=metadata["namespace"], uid=metadata.get("uid")),
            reason=reason, message=message[:1024], type=event_type,
            source=client.V1EventSource(component=EVENT_SOURCE),
            first_timestamp=now, last_timestamp=now, count=1,
            reporting_component=EVENT_SOURCE, reporting_instance=EVENT_SOURCE,
        )
        try:
            self.core.create_namespaced_event(metadata["namespace"], event)
        except ApiException as error:
            log.warning("event %s for %s not recorded: %s", reason, metadata["name"], error.reason)
