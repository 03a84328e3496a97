"""Checks of a rendered download container against the object-store client's upstream record
(`llmfleet.catalog.client_record`): image, shell, the flags of its `aws s3 sync` line and the
environment variables the client reads, each mismatch a readable line. Tests hold the product to them."""

from __future__ import annotations

import shlex
from typing import Any, Iterable, Mapping

from llmfleet.catalog.client_record import ClientRecord


def _sync_flags(script: str) -> list[list[str]]:
    """The flags of each `aws s3 sync` line of a shell script (a `${VAR:+--flag ...}` counts)."""
    lines = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line.replace("${", " ").replace(":+", " ").replace("}", " "))
        if words[:3] == ["aws", "s3", "sync"]:
            lines.append([word for word in words[3:] if word.startswith("--")])
    return lines


def check_download_container(record: ClientRecord, container: Mapping[str, Any]) -> list[str]:
    """Mismatches between a rendered download container and the client's record."""
    problems = []
    if container.get("image") != record.image:
        problems.append(f"image {container.get('image')!r} is not the recorded {record.image!r}")
    command: Iterable[str] = container.get("command") or ()
    command = list(command)
    if command[:1] != [record.shell]:
        problems.append(f"command runs {command[:1]}, not the image's shell {record.shell}")
    syncs = _sync_flags(command[-1] if command else "")
    if not syncs:
        problems.append("no `aws s3 sync` line in the command")
    known = record.global_flags | record.s3_sync_flags
    problems += [f"aws s3 sync: flag {flag} not in the record" for flags in syncs for flag in flags
                 if flag not in known]
    problems += [f"environment: {item['name']} is not a variable the client reads"
                 for item in container.get("env") or () if item["name"].startswith("AWS_")
                 and item["name"] not in record.environment]
    return problems
