"""The graph container."""

from __future__ import annotations

from collections.abc import Hashable, Iterator

Node = Hashable


class GraphError(KeyError):
    """A node or edge that the operation needs does not exist, or an edge is invalid."""

    def __str__(self) -> str:
        return str(self.args[0])


class Graph:
    """An adjacency map `node -> {neighbour: weight}`.

    Nodes and neighbours keep insertion order, which makes every traversal deterministic.
    In an undirected graph each edge is stored in both directions.
    """

    def __init__(self, directed: bool = False) -> None:
        self.directed = directed
        self._adjacency: dict[Node, dict[Node, float]] = {}

    def __contains__(self, node: object) -> bool:
        return node in self._adjacency

    def __len__(self) -> int:
        return len(self._adjacency)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._adjacency)

    def add_node(self, node: Node) -> None:
        """Adds `node` if it is not there yet."""
        self._adjacency.setdefault(node, {})

    def add_edge(self, source: Node, target: Node, weight: float = 1.0) -> None:
        """Adds (or re-weights) the edge `source -> target`, adding missing nodes.

        Raises:
            GraphError: if `weight` is negative.
        """
        if weight < 0:
            raise GraphError(f"edge {source!r} -> {target!r} has negative weight {weight}")
        self.add_node(source)
        self.add_node(target)
        self._adjacency[source][target] = float(weight)
        if not self.directed:
            self._adjacency[target][source] = float(weight)

    def remove_edge(self, source: Node, target: Node) -> None:
        """Removes the edge `source -> target` (both directions when undirected)."""
        if not self.has_edge(source, target):
            raise GraphError(f"no edge {source!r} -> {target!r}")
        del self._adjacency[source][target]
        if not self.directed:
            del self._adjacency[target][source]

    def remove_node(self, node: Node) -> None:
        """Removes `node` and every edge touching it."""
        self._require(node)
        del self._adjacency[node]
        for neighbours in self._adjacency.values():
            neighbours.pop(node, None)

    def has_edge(self, source: Node, target: Node) -> bool:
        return target in self._adjacency.get(source, {})

    def neighbours(self, node: Node) -> list[Node]:
        """Successors of `node`, in insertion order."""
        return list(self._require(node))

    def weight(self, source: Node, target: Node) -> float:
        if not self.has_edge(source, target):
            raise GraphError(f"no edge {source!r} -> {target!r}")
        return self._adjacency[source][target]

    def edges(self) -> list[tuple[Node, Node, float]]:
        """Every edge once; an undirected edge is listed from the node added first."""
        seen: set[tuple[Node, Node]] = set()
        result = []
        for source, neighbours in self._adjacency.items():
            for target, weight in neighbours.items():
                if not self.directed and (target, source) in seen:
                    continue
                seen.add((source, target))
                result.append((source, target, weight))
        return result

    def in_degree(self, node: Node) -> int:
        """Number of edges into `node` (equal to the degree when undirected)."""
        self._require(node)
        return sum(1 for neighbours in self._adjacency.values() if node in neighbours)

    def out_degree(self, node: Node) -> int:
        return len(self._require(node))

    def _require(self, node: Node) -> dict[Node, float]:
        if node not in self._adjacency:
            raise GraphError(f"no node {node!r}")
        return self._adjacency[node]
