"""Breadth-first and depth-first traversals, components and cycle detection."""

from __future__ import annotations

from collections import deque

from graphkit.graph import Graph, Node


def bfs_order(graph: Graph, start: Node) -> list[Node]:
    """Nodes reachable from `start` in breadth-first order."""
    graph.neighbours(start)  # raises GraphError for an unknown start
    order = [start]
    seen = {start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for neighbour in graph.neighbours(node):
            if neighbour not in seen:
                seen.add(neighbour)
                order.append(neighbour)
                queue.append(neighbour)
    return order


def dfs_order(graph: Graph, start: Node) -> list[Node]:
    """Nodes reachable from `start` in depth-first preorder, visiting neighbours in insertion order."""
    graph.neighbours(start)
    order: list[Node] = []
    seen: set[Node] = set()
    stack = [start]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        order.append(node)
        # Reversed so that the first neighbour is popped (visited) first.
        stack.extend(reversed([n for n in graph.neighbours(node) if n not in seen]))
    return order


def connected_components(graph: Graph) -> list[list[Node]]:
    """Components of an undirected graph, each in BFS order, ordered by their first node.

    Raises:
        ValueError: for a directed graph, where "connected" is ambiguous.
    """
    if graph.directed:
        raise ValueError("connected_components needs an undirected graph")
    seen: set[Node] = set()
    components = []
    for node in graph:
        if node not in seen:
            component = bfs_order(graph, node)
            seen.update(component)
            components.append(component)
    return components


def has_cycle(graph: Graph) -> bool:
    """Whether the graph has a cycle; in an undirected graph an edge back to the parent is not one."""
    if graph.directed:
        return _has_directed_cycle(graph)
    seen: set[Node] = set()
    for root in graph:
        if root in seen:
            continue
        seen.add(root)
        stack: list[tuple[Node, Node | None]] = [(root, None)]
        while stack:
            node, parent = stack.pop()
            for neighbour in graph.neighbours(node):
                if neighbour == parent:
                    continue
                if neighbour in seen:
                    return True
                seen.add(neighbour)
                stack.append((neighbour, node))
    return False


def _has_directed_cycle(graph: Graph) -> bool:
    """Three-colour DFS: reaching a node that is still on the path (grey) closes a cycle."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)

    def visit(node: Node) -> bool:
        colour[node] = grey
        for neighbour in graph.neighbours(node):
            if colour[neighbour] == grey:
                return True
            if colour[neighbour] == white and visit(neighbour):
                return True
        colour[node] = black
        return False

    return any(colour[node] == white and visit(node) for node in graph)
