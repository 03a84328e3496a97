"""The emulated engine build (`trtllm-build` stand-in for the sandbox's build Jobs).

It honours the real build's cache layout (docs/render.md): an entry `<cache>/<key>/` is complete
when its marker exists; the build writes `engine/` and `tokenizer/` first and the marker last,
so a build killed half-way leaves no marker and is redone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from llmfleet.render.layout import BUILD_COMPLETE_MARKER, ENGINE_SUBDIR, TOKENIZER_SUBDIR

PROGRESS_INTERVAL_S = 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llmfleet_sandbox.emulator.build",
        description="Emulate a TensorRT-LLM engine build into an engine cache entry. Exits 0 at once if "
                    f"CACHE_DIR/KEY/{BUILD_COMPLETE_MARKER} exists; otherwise takes --duration-seconds, "
                    f"writes CACHE_DIR/KEY/{ENGINE_SUBDIR}/ and {TOKENIZER_SUBDIR}/, then the marker.")
    parser.add_argument("--cache-dir", required=True, type=Path, help="engine cache root (a volume in the pod)")
    parser.add_argument("--key", required=True, help="engine cache key: the entry's directory name")
    parser.add_argument("--duration-seconds", type=float, default=0.0,
                        help="how long the build takes, printing progress every second (default 0)")
    parser.add_argument("--fail-with", metavar="MESSAGE",
                        help="fail after the build time with this message and exit code 1 (for failure tests)")
    return parser


def build(cache_dir: Path, key: str, duration_seconds: float, fail_with: str | None) -> int:
    entry = cache_dir / key
    if (entry / BUILD_COMPLETE_MARKER).exists():
        print(f"engine {key} already built, skipping", flush=True)
        return 0
    print(f"building engine {key} in {entry} ({duration_seconds:g} s)", flush=True)
    start_s = time.monotonic()
    while (elapsed_s := time.monotonic() - start_s) < duration_seconds:
        print(f"building engine {key}: {min(100, round(100 * elapsed_s / duration_seconds))}%", flush=True)
        time.sleep(min(PROGRESS_INTERVAL_S, duration_seconds - elapsed_s))
    if fail_with is not None:
        print(f"engine {key} build failed: {fail_with}", file=sys.stderr, flush=True)
        return 1
    (entry / ENGINE_SUBDIR).mkdir(parents=True, exist_ok=True)
    (entry / TOKENIZER_SUBDIR).mkdir(parents=True, exist_ok=True)
    (entry / ENGINE_SUBDIR / "config.json").write_text(json.dumps(
        {"emulated": True, "engineCacheKey": key, "builtAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        indent=2) + "\n")
    (entry / TOKENIZER_SUBDIR / "tokenizer_config.json").write_text(json.dumps(
        {"emulated": True, "tokenizer": "one token per whitespace-separated word"}, indent=2) + "\n")
    (entry / BUILD_COMPLETE_MARKER).write_text(f"{key}\n")
    print(f"engine {key} built: 100%", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.duration_seconds < 0:
        _parser().error("--duration-seconds must not be negative")
    return build(args.cache_dir, args.key, args.duration_seconds, args.fail_with)


if __name__ == "__main__":
    sys.exit(main())
