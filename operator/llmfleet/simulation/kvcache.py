"""A paged KV cache: fixed-size token blocks from a fixed budget, with optional prefix reuse (pure).

Blocks are counted, not filled: the emulator needs the bookkeeping (how many blocks a sequence
holds, which full prompt blocks can be shared) and none of the data. A full prompt block is
identified by a hash chained over all prompt blocks before it, so a block is only reused when
the whole prefix up to it matches (same tokens at the same positions).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Sequence


class KvCacheExhausted(RuntimeError):
    """More blocks were asked for than are free; the scheduler must check before allocating."""


def blocks_for_tokens(tokens: int, block_tokens: int) -> int:
    return math.ceil(tokens / block_tokens)


def prompt_block_hashes(prompt_token_ids: Sequence[Hashable], block_tokens: int) -> tuple[int, ...]:
    """One chained hash per full block of the prompt (a partial last block is never shared)."""
    hashes = []
    previous = 0
    for start in range(0, len(prompt_token_ids) - block_tokens + 1, block_tokens):
        previous = hash((previous, tuple(prompt_token_ids[start:start + block_tokens])))
        hashes.append(previous)
    return tuple(hashes)


@dataclass(frozen=True)
class PrefixMatch:
    blocks: int
    # Matched blocks that nobody holds right now: they count as free until reused.
    evictable_blocks: int


class KvBlockAllocator:
    def __init__(self, total_blocks: int, enable_prefix_reuse: bool):
        self.total_blocks = total_blocks
        self.enable_prefix_reuse = enable_prefix_reuse
        self.reused_blocks_total = 0
        self._free_uncached = list(range(total_blocks - 1, -1, -1))  # stack of free blocks with no reusable content
        self._holders_by_block: dict[int, int] = {}
        self._block_by_hash: dict[int, int] = {}
        self._hash_by_block: dict[int, int] = {}
        # Cached blocks nobody holds, least recently released first: evicted in this order.
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._evictable)

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    def allocate(self, count: int) -> list[int]:
        if count > self.free_blocks:
            raise KvCacheExhausted(f"asked for {count} KV blocks, {self.free_blocks} free")
        blocks = []
        for _ in range(count):
            if self._free_uncached:
                block = self._free_uncached.pop()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._block_by_hash[self._hash_by_block.pop(block)]
            self._holders_by_block[block] = 1
            blocks.append(block)
        return blocks

    def match_prefix(self, block_hashes: Sequence[int]) -> PrefixMatch:
        if not self.enable_prefix_reuse:
            return PrefixMatch(0, 0)
        matched = evictable = 0
        for block_hash in block_hashes:
            block = self._block_by_hash.get(block_hash)
            if block is None:
                break
            matched += 1
            evictable += block in self._evictable
        return PrefixMatch(matched, evictable)

    def acquire_prefix(self, block_hashes: Sequence[int]) -> list[int]:
        """Take a hold on the cached blocks of the prefix; the caller checked `match_prefix`."""
        blocks = [self._block_by_hash[block_hash] for block_hash in block_hashes]
        for block in blocks:
            if block in self._evictable:
                del self._evictable[block]
                self._holders_by_block[block] = 1
            else:
                self._holders_by_block[block] += 1
        self.reused_blocks_total += len(blocks)
        return blocks

    def publish(self, block: int, block_hash: int) -> None:
        """Offer a filled prompt block for reuse by later prompts with the same prefix."""
        if not self.enable_prefix_reuse or block_hash in self._block_by_hash or block in self._hash_by_block:
            return
        self._block_by_hash[block_hash] = block
        self._hash_by_block[block] = block_hash

    def release(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            holders = self._holders_by_block[block] - 1
            if holders:
                self._holders_by_block[block] = holders
                continue
            del self._holders_by_block[block]
            if block in self._hash_by_block:
                self._evictable[block] = None
            else:
                self._free_uncached.append(block)
