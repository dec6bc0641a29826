"""graphkit: graphs, traversals and shortest paths."""

from graphkit.graph import Graph, GraphError
from graphkit.paths import CycleError, hop_distances, shortest_path, topological_sort
from graphkit.traversal import bfs_order, connected_components, dfs_order, has_cycle

__all__ = [
    "CycleError",
    "Graph",
    "GraphError",
    "bfs_order",
    "connected_components",
    "dfs_order",
    "has_cycle",
    "hop_distances",
    "shortest_path",
    "topological_sort",
]
