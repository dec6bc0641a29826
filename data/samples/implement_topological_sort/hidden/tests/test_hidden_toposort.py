"""topological_sort: Kahn order with insertion-order tie-breaking, cycle and undirected errors."""

# Import grouping differs between this folder and the task workspace (where graphkit is first-party).
# ruff: noqa: I001

import pytest

from graphkit import CycleError, Graph, topological_sort


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


def test_topological_sort_prefers_insertion_order():
    graph = directed(("shirt", "tie"), ("pants", "shoes"), ("tie", "jacket"), ("pants", "belt"))
    graph.add_edge("belt", "jacket")
    assert topological_sort(graph) == ["shirt", "pants", "tie", "shoes", "belt", "jacket"]


def test_topological_sort_reports_cycle():
    graph = directed(("start", "a"), ("a", "b"), ("b", "a"))
    with pytest.raises(CycleError) as info:
        topological_sort(graph)
    message = str(info.value)
    assert "'a'" in message
    assert "'b'" in message
    assert "'start'" not in message


def test_topological_sort_rejects_undirected():
    with pytest.raises(ValueError):
        topological_sort(undirected(("a", "b")))


def test_topological_sort_respects_every_edge():
    graph = directed(("e", "d"), ("d", "c"), ("c", "b"), ("b", "a"), ("e", "a"))
    order = topological_sort(graph)
    assert order == ["e", "d", "c", "b", "a"]
    for source, target, _ in graph.edges():
        assert order.index(source) < order.index(target)


def test_topological_sort_isolated_nodes_and_empty_graph():
    graph = directed(("a", "b"))
    graph.add_node("solo")
    assert topological_sort(graph) == ["a", "solo", "b"]
    assert topological_sort(Graph(directed=True)) == []


def test_topological_sort_self_loop_is_a_cycle():
    with pytest.raises(CycleError):
        topological_sort(directed(("a", "a")))
