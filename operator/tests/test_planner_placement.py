"""Whole replicas onto nodes (planner.placement): equal replicas pack exactly node by node."""

from __future__ import annotations

import pytest

from llmfleet.planner.placement import (
    MAX_NODES_NAMED,
    group_room,
    part_room,
    per_node,
    replica_extent,
    replicas_per_node,
    replicas_that_fit,
)


def test_each_node_holds_whole_replicas_and_nothing_spans_two():
    assert replicas_per_node([("n1", 4), ("n2", 4)], 8) == []
    assert replicas_that_fit([("n1", 4), ("n2", 4)], 8) == 0
    assert replicas_per_node([("a", 3), ("b", 8), ("c", 6)], 4) == [("b", 2), ("c", 1)]
    assert replicas_that_fit([("a", 3), ("b", 8), ("c", 6)], 4) == 3
    assert replicas_that_fit([], 1) == 0
    with pytest.raises(ValueError):
        replicas_per_node([("a", 8)], 0)


def test_per_node_names_the_roomiest_nodes_and_sums_up_the_rest():
    assert per_node([("n2", 4), ("n1", 4), ("n3", 6)]) == "n3 6, n1 4, n2 4"
    assert per_node([]) == "no node"
    many = [(f"n{i:02}", i % 4) for i in range(MAX_NODES_NAMED + 4)]
    text = per_node(many)
    assert text.count(",") == MAX_NODES_NAMED - 1 and text.endswith("and 4 more nodes with 0-1 each")


def test_a_group_needs_whole_parts_on_separate_nodes_not_its_gpus_anywhere():
    # 16 free GPUs, but only one node holds a part of 8: no group of two nodes fits.
    assert replicas_that_fit([("n1", 8), ("n2", 4), ("n3", 4)], 16, nodes_per_replica=2) == 0
    assert replicas_that_fit([("n1", 8), ("n2", 8), ("n3", 4)], 16, nodes_per_replica=2) == 1
    assert replica_extent(16, 2) == "over 2 nodes of 8" and replica_extent(8, 1) == "on one node"


def test_the_group_room_names_the_nodes_that_hold_a_part_and_what_each_other_lacks():
    assert group_room([("n1", 8), ("n2", 3), ("n3", 8), ("n4", 0)], 8, 4) == (
        "4 nodes with 8 free are needed and 2 have them (n1 8, n3 8); lacking per node: n4 8, n2 5")
    assert group_room([("n1", 4), ("n2", 4)], 8, 2) == (
        "2 nodes with 8 free are needed and 0 have them; lacking per node: n1 4, n2 4")


def test_the_part_room_names_the_nodes_with_a_part_free_and_what_the_others_lack():
    assert part_room([("n1", 8), ("n2", 3)], 8) == "1 node(s) have 8 free (n1 8); lacking per node: n2 5"
    assert part_room([("n1", 0)], 8) == "no node has 8 free; lacking per node: n1 8"
