"""The list-then-watch loop every sandbox component runs, as client-go's reflector does for a
kubelet, kube-proxy or CoreDNS: list, hand the items over as one "RESET", then each watch
event's object from the list's resourceVersion until the watch ends (its timeout, an ERROR
event such as 410 Gone, a broken connection), and list again."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from kubernetes import client, watch

# on_event(event type, objects): "RESET" with the whole listing, then ADDED, MODIFIED or
# DELETED with one object.
EventHandler = Callable[[str, list[dict]], None]
RELIST_PAUSE_SECONDS = 1.0


def watch_forever(list_call: Callable, on_event: EventHandler, stopping: threading.Event, *, what: str,
                  log: Callable[[str], None] = lambda line: print(line, flush=True), watch_seconds: int = 300,
                  read_timeout_seconds: float | None = None, **selectors: Any) -> None:
    """Until `stopping` is set. `selectors` (field_selector, label_selector) go to the list and
    the watch; `read_timeout_seconds` ends a watch that stays silent that long (a dead
    connection otherwise holds it until `watch_seconds`)."""
    api = client.ApiClient()
    request = {} if read_timeout_seconds is None else {"_request_timeout": (10, read_timeout_seconds)}
    while not stopping.is_set():
        try:
            listing = api.sanitize_for_serialization(list_call(**selectors))
            on_event("RESET", listing["items"])
            stream = watch.Watch()
            for event in stream.stream(list_call, timeout_seconds=watch_seconds, _preload_content=False,
                                       resource_version=listing["metadata"]["resourceVersion"],
                                       **selectors, **request):
                if stopping.is_set():
                    stream.stop()
                    break
                if event["type"] == "ERROR":
                    break
                on_event(event["type"], [event["raw_object"]])
        except Exception as error:  # noqa: BLE001 - relist, as a reflector does
            if not stopping.is_set():
                log(f"{what} watch failed, relisting: {error!r}")
                time.sleep(RELIST_PAUSE_SECONDS)


def each_object(handle: Callable[[str, dict], None]) -> EventHandler:
    """For components that handle one object at a time: a listing's objects as ADDED."""
    def on_event(event_type: str, objects: list[dict]) -> None:
        for item in objects:
            handle("ADDED" if event_type == "RESET" else event_type, item)
    return on_event
