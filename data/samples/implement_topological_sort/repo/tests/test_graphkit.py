import pytest

from graphkit import (
    Graph,
    GraphError,
    bfs_order,
    connected_components,
    dfs_order,
    has_cycle,
    hop_distances,
    shortest_path,
)


def directed(*edges):
    graph = Graph(directed=True)
    for edge in edges:
        graph.add_edge(*edge)
    return graph


def undirected(*edges):
    graph = Graph()
    for edge in edges:
        graph.add_edge(*edge)
    return graph


def test_add_edge_undirected_stores_both_directions():
    graph = undirected(("a", "b", 2))
    assert graph.has_edge("a", "b")
    assert graph.has_edge("b", "a")
    assert graph.weight("b", "a") == 2.0
    assert len(graph) == 2


def test_add_edge_directed_is_one_way():
    graph = directed(("a", "b"))
    assert graph.has_edge("a", "b")
    assert not graph.has_edge("b", "a")
    assert graph.neighbours("b") == []


def test_add_edge_rejects_negative_weight_but_allows_zero():
    graph = Graph()
    with pytest.raises(GraphError, match="negative weight -1"):
        graph.add_edge("a", "b", -1)
    graph.add_edge("a", "b", 0)
    assert graph.weight("a", "b") == 0.0


def test_add_node_is_idempotent_and_keeps_edges():
    graph = directed(("a", "b"))
    graph.add_node("a")
    assert graph.neighbours("a") == ["b"]
    assert "a" in graph
    assert "z" not in graph


def test_remove_edge_and_errors():
    graph = undirected(("a", "b"), ("b", "c"))
    graph.remove_edge("b", "a")
    assert not graph.has_edge("a", "b")
    assert graph.neighbours("b") == ["c"]
    with pytest.raises(GraphError, match="no edge 'a' -> 'b'"):
        graph.remove_edge("a", "b")


def test_remove_directed_edge_keeps_reverse():
    graph = directed(("a", "b"), ("b", "a"))
    graph.remove_edge("a", "b")
    assert graph.has_edge("b", "a")


def test_remove_node_drops_incident_edges():
    graph = directed(("a", "b"), ("c", "b"), ("b", "d"))
    graph.remove_node("b")
    assert list(graph) == ["a", "c", "d"]
    assert graph.edges() == []
    with pytest.raises(GraphError, match="no node 'b'"):
        graph.remove_node("b")


def test_edges_lists_undirected_edges_once():
    graph = undirected(("a", "b", 1), ("b", "c", 2))
    assert graph.edges() == [("a", "b", 1.0), ("b", "c", 2.0)]
    assert directed(("a", "b"), ("b", "a")).edges() == [("a", "b", 1.0), ("b", "a", 1.0)]


def test_degrees():
    graph = directed(("a", "b"), ("c", "b"), ("b", "d"))
    assert graph.in_degree("b") == 2
    assert graph.out_degree("b") == 1
    assert graph.in_degree("a") == 0
    with pytest.raises(GraphError):
        graph.out_degree("zz")


def test_weight_of_missing_edge():
    with pytest.raises(GraphError, match="no edge"):
        directed(("a", "b")).weight("b", "a")


def test_bfs_order():
    graph = undirected(("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"))
    assert bfs_order(graph, "a") == ["a", "b", "c", "d", "e"]


def test_dfs_order_follows_insertion_order():
    graph = undirected(("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"))
    assert dfs_order(graph, "a") == ["a", "b", "d", "c", "e"]


def test_traversals_reject_unknown_start():
    graph = undirected(("a", "b"))
    for traversal in (bfs_order, dfs_order, hop_distances):
        with pytest.raises(GraphError, match="no node 'x'"):
            traversal(graph, "x")


def test_traversal_of_isolated_node():
    graph = Graph()
    graph.add_node("solo")
    assert bfs_order(graph, "solo") == ["solo"]
    assert dfs_order(graph, "solo") == ["solo"]


def test_connected_components():
    graph = undirected(("a", "b"), ("c", "d"), ("b", "e"))
    graph.add_node("f")
    assert connected_components(graph) == [["a", "b", "e"], ["c", "d"], ["f"]]


def test_connected_components_rejects_directed():
    with pytest.raises(ValueError, match="undirected"):
        connected_components(directed(("a", "b")))


def test_has_cycle_undirected():
    assert not has_cycle(undirected(("a", "b"), ("b", "c"), ("x", "y")))
    assert has_cycle(undirected(("a", "b"), ("b", "c"), ("c", "a")))


def test_has_cycle_directed():
    assert not has_cycle(directed(("a", "b"), ("a", "c"), ("b", "c")))
    assert has_cycle(directed(("a", "b"), ("b", "c"), ("c", "a")))
    assert has_cycle(directed(("x", "y"), ("a", "a")))


def test_shortest_path_prefers_cheaper_longer_route():
    graph = directed(("a", "b", 1), ("b", "c", 1), ("a", "c", 5), ("c", "d", 1))
    assert shortest_path(graph, "a", "d") == (["a", "b", "c", "d"], 3.0)


def test_shortest_path_to_self_and_undirected():
    graph = undirected(("a", "b", 4), ("b", "c", 1), ("a", "c", 7))
    assert shortest_path(graph, "a", "a") == (["a"], 0.0)
    assert shortest_path(graph, "c", "a") == (["c", "b", "a"], 5.0)


def test_shortest_path_errors():
    graph = directed(("a", "b"))
    graph.add_node("island")
    with pytest.raises(GraphError, match="no path from 'a' to 'island'"):
        shortest_path(graph, "a", "island")
    with pytest.raises(GraphError, match="no node 'x'"):
        shortest_path(graph, "a", "x")


def test_hop_distances():
    graph = directed(("a", "b", 9), ("b", "c"), ("a", "c", 1), ("c", "d"))
    assert hop_distances(graph, "a") == {"a": 0, "b": 1, "c": 1, "d": 2}
    assert hop_distances(graph, "d") == {"d": 0}
