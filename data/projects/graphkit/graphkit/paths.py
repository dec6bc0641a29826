"""Orderings and shortest paths."""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from graphkit.graph import Graph, GraphError, Node


class CycleError(ValueError):
    """A topological order was requested for a graph with a cycle."""


def topological_sort(graph: Graph) -> list[Node]:
    """Kahn's algorithm; among ready nodes the earliest-inserted goes first.

    Raises:
        ValueError: for an undirected graph.
        CycleError: if some nodes cannot be ordered; the message lists them (repr of each),
            i.e. the nodes on a cycle and those reachable only through one.
    """
    if not graph.directed:
        raise ValueError("topological_sort needs a directed graph")
    remaining = {node: graph.in_degree(node) for node in graph}
    ready = deque(node for node, degree in remaining.items() if degree == 0)
    order = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for neighbour in graph.neighbours(node):
            remaining[neighbour] -= 1
            if remaining[neighbour] == 0:
                ready.append(neighbour)
    if len(order) < len(graph):
        placed = set(order)
        stuck = [node for node in graph if node not in placed]
        raise CycleError(f"graph has a cycle through {stuck!r}")
    return order


def shortest_path(graph: Graph, source: Node, target: Node) -> tuple[list[Node], float]:
    """Dijkstra: the cheapest path from `source` to `target` and its total weight.

    Raises:
        GraphError: if either node is missing or `target` is unreachable.
    """
    for node in (source, target):
        if node not in graph:
            raise GraphError(f"no node {node!r}")
    # The counter breaks ties between equal distances without comparing nodes.
    counter = itertools.count()
    frontier: list[tuple[float, int, Node]] = [(0.0, next(counter), source)]
    best: dict[Node, float] = {source: 0.0}
    previous: dict[Node, Node] = {}
    done: set[Node] = set()
    while frontier:
        distance, _, node = heapq.heappop(frontier)
        if node in done:
            continue
        done.add(node)
        if node == target:
            return _walk_back(previous, source, target), distance
        for neighbour in graph.neighbours(node):
            candidate = distance + graph.weight(node, neighbour)
            if candidate < best.get(neighbour, float("inf")):
                best[neighbour] = candidate
                previous[neighbour] = node
                heapq.heappush(frontier, (candidate, next(counter), neighbour))
    raise GraphError(f"no path from {source!r} to {target!r}")


def _walk_back(previous: dict[Node, Node], source: Node, target: Node) -> list[Node]:
    path = [target]
    while path[-1] != source:
        path.append(previous[path[-1]])
    path.reverse()
    return path


def hop_distances(graph: Graph, source: Node) -> dict[Node, int]:
    """Number of edges on a shortest unweighted path from `source` to each reachable node."""
    distances = {source: 0}
    queue = deque([source])
    graph.neighbours(source)
    while queue:
        node = queue.popleft()
        for neighbour in graph.neighbours(node):
            if neighbour not in distances:
                distances[neighbour] = distances[node] + 1
                queue.append(neighbour)
    return distances
