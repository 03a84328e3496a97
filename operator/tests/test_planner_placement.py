"""Whole replicas onto nodes (planner.placement): equal replicas pack exactly node by node."""

from __future__ import annotations

import pytest

from llmfleet.planner.placement import MAX_NODES_NAMED, per_node, replicas_per_node, replicas_that_fit


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
