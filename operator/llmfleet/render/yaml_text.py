"""YAML text of rendered files (pure).

Every pass renders the files it compares with what serves, so their YAML is written often:
libyaml's emitter, where PyYAML was built with it, writes the same text several times faster
than the pure-Python one (a third of a settled pass's time was YAML emission)."""

from __future__ import annotations

from typing import Any

import yaml

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_text(data: Any) -> str:
    """`data` as YAML, keys in their order: what yaml.safe_dump(data, sort_keys=False) writes."""
    return yaml.dump(data, Dumper=_DUMPER, sort_keys=False)
