"""The layered layout of a flow's graph."""

from __future__ import annotations

from flowengine.dashboard.layout import layers, layout


def test_each_atom_is_right_of_what_it_waits_for() -> None:
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("a", "d"), ("x", "nowhere")]
    assert layers(["d", "c", "b", "a"], edges) == [["a"], ["c", "b"], ["d"]]
    drawn = layout({"a": "task", "b": "task", "c": "retry", "d": "task"}, edges)
    x = {node.name: node.x for node in drawn.nodes}
    assert x["a"] < x["b"] == x["c"] < x["d"]
    assert len(drawn.links) == 5 and drawn.width > x["d"] and drawn.height > 0


def test_a_cycle_does_not_lose_atoms() -> None:
    found = layers(["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "b")])
    assert sorted(name for column in found for name in column) == ["a", "b", "c"]
    assert layout({}, []).nodes == []
