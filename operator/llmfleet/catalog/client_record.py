"""The upstream record of the object-store download client (``clients/<name>.yaml``): image, shell,
the flags of `aws s3 sync` and the environment variables the client reads. Facts carry their
upstream source; the tests check rendered download containers against it with
``llmfleet_dev.client_checks``."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

CLIENTS_DIR = "clients"
# The pinned download client for s3:// sources.
OBJECT_STORE_CLIENT = "aws-cli-2.36.7"


@dataclass(frozen=True)
class ClientRecord:
    client: str
    image: str
    entrypoint: str
    shell: str
    global_flags: frozenset[str]
    s3_sync_flags: frozenset[str]
    environment: frozenset[str]


@functools.lru_cache(maxsize=None)
def load_client_record(name: str = OBJECT_STORE_CLIENT) -> ClientRecord:
    raw = yaml.safe_load(resources.files(__package__).joinpath(CLIENTS_DIR, f"{name}.yaml").read_text("utf-8"))
    return ClientRecord(
        client=raw["client"], image=raw["image"]["name"], entrypoint=raw["entrypoint"]["value"],
        shell=raw["shell"]["value"],
        global_flags=frozenset(entry["name"] for entry in raw["global_flags"]),
        s3_sync_flags=frozenset(entry["name"] for entry in raw["s3_sync_flags"]),
        environment=frozenset(entry["name"] for entry in raw["environment"]))
