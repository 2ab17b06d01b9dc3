"""Engine groups over nodes (paper 6.1): which nodes of one role fetch together.

Why in core: the runtime's launcher and the simulator must form the same groups from the
same ``cluster.nodes_per_group``. The paper says only that a group is all PEs or all DEs and
that all engines of a node are in one group, so a group may span several nodes (an
expert-parallel group). Our rule: groups are runs of ``nodes_per_group`` consecutive nodes of
one role; when the role's node count is not a multiple, its last group is smaller. A group's
leader (the engine that fetches for it) is the first engine of its first node.
"""

from __future__ import annotations

from dualpath_cli.errors import UsageError

__all__ = ["check_nodes_per_group", "group_start", "node_groups"]


def check_nodes_per_group(nodes_per_group: int) -> int:
    """``nodes_per_group`` if it is an integer >= 1.

    Raises:
        UsageError: anything else, in one line.
    """
    if isinstance(nodes_per_group, bool) or not isinstance(nodes_per_group, int) or (
            nodes_per_group < 1):
        raise UsageError(f"nodes per group {nodes_per_group!r}: must be an integer >= 1")
    return nodes_per_group


def node_groups(nodes: int, nodes_per_group: int) -> list[range]:
    """The groups of one role's ``nodes`` nodes (positions ``0..nodes-1`` within the role),
    each a run of ``nodes_per_group`` consecutive positions; the last may be shorter.

    >>> [list(g) for g in node_groups(5, 2)]
    [[0, 1], [2, 3], [4]]
    """
    per = check_nodes_per_group(nodes_per_group)
    return [range(start, min(start + per, nodes)) for start in range(0, max(0, nodes), per)]


def group_start(position: int, nodes_per_group: int) -> int:
    """The position (within its role) of the first node of the group holding the node at
    ``position``: the group's id, offset by the role's first node, where ids are node
    indices (the runtime's), and the node whose first engine leads the group.

    >>> [group_start(p, 2) for p in range(5)]
    [0, 0, 2, 2, 4]
    """
    return position - position % check_nodes_per_group(nodes_per_group)
