"""The paged KV block allocator of the emulator."""

import pytest

from llmfleet.simulation.kvcache import KvBlockAllocator, KvCacheExhausted, blocks_for_tokens, prompt_block_hashes


def test_blocks_for_tokens_rounds_up_to_whole_blocks():
    assert [blocks_for_tokens(tokens, 64) for tokens in (0, 1, 64, 65, 128)] == [0, 1, 1, 2, 2]


def test_allocation_takes_distinct_blocks_and_exhaustion_raises():
    kv = KvBlockAllocator(10, enable_prefix_reuse=False)
    first, second = kv.allocate(4), kv.allocate(6)
    assert len(set(first + second)) == 10 and (kv.free_blocks, kv.used_blocks) == (0, 10)
    with pytest.raises(KvCacheExhausted, match="asked for 1 KV blocks, 0 free"):
        kv.allocate(1)
    kv.release(first)
    assert kv.free_blocks == 4 and sorted(kv.allocate(4)) == sorted(first)


def test_prompt_block_hashes_cover_full_blocks_and_chain_over_the_prefix():
    tokens = [f"t{index}" for index in range(10)]
    hashes = prompt_block_hashes(tokens, 4)
    assert len(hashes) == 2  # the last 2 tokens make a partial block, never shared
    assert prompt_block_hashes(tokens[:8] + ["other"], 4) == hashes
    # Same second block after a different first block is a different block.
    changed_first = prompt_block_hashes(["x"] + tokens[1:], 4)
    assert changed_first[0] != hashes[0] and changed_first[1] != hashes[1]


def test_published_prompt_blocks_are_shared_and_survive_their_holder_until_evicted():
    kv = KvBlockAllocator(4, enable_prefix_reuse=True)
    hashes = prompt_block_hashes([f"t{index}" for index in range(8)], 4)
    blocks = kv.allocate(3)
    kv.publish(blocks[0], hashes[0])
    kv.publish(blocks[1], hashes[1])
    assert kv.match_prefix(hashes).blocks == 2

    shared = kv.acquire_prefix(hashes)
    assert shared == blocks[:2] and kv.reused_blocks_total == 2
    kv.release(blocks)
    assert kv.used_blocks == 2  # still held by the second sequence
    kv.release(shared)
    # Nobody holds them: free for allocation, yet still matchable.
    assert kv.free_blocks == 4 and kv.match_prefix(hashes).evictable_blocks == 2

    kv.allocate(2)  # uses the never-cached blocks first
    assert kv.match_prefix(hashes).blocks == 2
    kv.allocate(1)  # then evicts the least recently released cached block
    assert kv.match_prefix(hashes).blocks == 0


def test_without_prefix_reuse_nothing_is_matched():
    kv = KvBlockAllocator(4, enable_prefix_reuse=False)
    hashes = prompt_block_hashes(["a", "b"], 2)
    kv.publish(kv.allocate(1)[0], hashes[0])
    assert kv.match_prefix(hashes).blocks == 0
