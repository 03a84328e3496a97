"""The operator gives back what a burst freed: measured on a child process's RSS."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Four threads allocate 2 KiB blocks (malloc, not Python's small-object pools), keep every 50th
# so the arenas cannot shrink from their tops, and free the rest; RSS before and after.
PROGRAM = textwrap.dedent("""
    import sys, threading
    from llmfleet.heap import release_free_heap

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    kept = []
    def work():
        blocks = [bytes(2048) + bytes([i % 256]) for i in range(50_000)]
        kept.extend(blocks[::50])
    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    before = rss_mib()
    released = release_free_heap() if sys.argv[1] == "release" else False
    print(before, rss_mib(), released)
""")


def _rss_before_and_after(action: str) -> tuple[float, float, bool]:
    result = subprocess.run([sys.executable, "-c", PROGRAM, action], capture_output=True, text=True, check=True)
    before, after, released = result.stdout.split()
    return float(before), float(after), released == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_freed_blocks_spread_over_thread_arenas_go_back_to_the_system():
    before, after, released = _rss_before_and_after("release")
    assert released
    assert before > 300 and after < before / 2, (before, after)
    # Without the release they stay: what the operator saw after a burst.
    before, after, _ = _rss_before_and_after("keep")
    assert after > before * 0.9, (before, after)

