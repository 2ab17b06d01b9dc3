"""Copy named hot blocks to a launched cluster's replica roots (the long-tail remedy).

Why here and not in the engines: a copy is a file on a shared mount (3FS, NFS), so one
process makes it and every engine on every node finds it (storage/replicas.py probes a hot
block's replica roots every few reads). The launcher holds the store root and the replica
roots; it reads the block from the root (header and payload checksums verified), writes it
atomically to each replica root and reads each copy back, verified, before it counts.
``POST /api/v1/store/replicate`` (token, audited as ``replicate``) and ``dualpath diagnose
long-tail --fix`` call this.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dualpath_cli.core.layout import KEY_BYTES
from dualpath_cli.errors import UsageError

__all__ = ["replicate_blocks", "MAX_BLOCKS", "NoReplicaRoots", "NO_REPLICA_ROOTS"]

#: Blocks one request may name (a hot set is a handful; this bounds the work of one call).
MAX_BLOCKS = 64
#: How the refusal of a store without replica roots begins (the API passes the message on:
#: a client tells this refusal, a precondition of the cluster, from a failed copy).
NO_REPLICA_ROOTS = "this cluster's store has no replica roots"


class NoReplicaRoots(UsageError):
    """The cluster's store has no replica roots: a copy has nowhere to go."""


def check_block_keys(blocks: Sequence[str]) -> list[str]:
    """The named blocks as lower-case hex keys, each once (the server and the shipped
    fake client refuse the same input)."""
    if not blocks:
        raise UsageError("no blocks given; expected block keys (32 hex digits each)")
    if len(blocks) > MAX_BLOCKS:
        raise UsageError(f"{len(blocks)} blocks given; at most {MAX_BLOCKS} per request")
    keys: list[str] = []
    for b in blocks:
        k = b.strip().lower()
        if len(k) != 2 * KEY_BYTES or any(c not in "0123456789abcdef" for c in k):
            raise UsageError(f"block {b!r} is not a block key ({2 * KEY_BYTES} hex digits, "
                             "as diagnose and storage inspect list them)")
        if k not in keys:
            keys.append(k)
    return keys


def _escapes(roots: Sequence[Path], paths: Sequence[Path]) -> list[int]:
    """The indices of the roots whose block path resolves outside them (a symlinked file
    or directory inside the store that leads out).

    Why: a client names blocks by key and the copy reads one root and writes the others; a
    link inside a root must not turn that into a read or write elsewhere on the machine.
    """
    return [i for i, (root, path) in enumerate(zip(roots, paths, strict=True))
            if not os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)]


def replicate_blocks(store_dir: Path | None, replica_dirs: Sequence[Path],
                     blocks: Sequence[str], copies: int | None = None
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Give each named block up to ``copies`` verified copies in total (the root's
    included; default: one on every replica root).

    Returns:
        ``(old, new)`` for the audit: the roots holding each block before and after, and
        per block what failed (a block missing or corrupt in the root is not copied).

    Raises:
        NoReplicaRoots: the store has no replica roots (``storage.replica_roots``).
        UsageError: a bad block key, too many blocks, ``copies`` below 2.
    """
    from dualpath_cli.core.layout import BlockKey
    from dualpath_cli.storage import PosixStore, ReplicatedStore
    from dualpath_cli.storage.errors import StorageError

    keys = check_block_keys(blocks)
    if store_dir is None or not replica_dirs:
        raise NoReplicaRoots(f"{NO_REPLICA_ROOTS}, so a copy has nowhere to go: launch "
                             "it with --replica-root DIR (repeatable; or set "
                             "storage.replica_roots)")
    roots = [store_dir, *replica_dirs]
    want = len(roots) if copies is None else copies
    if want < 2:
        raise UsageError(f"copies={copies}: a replica needs at least 2 copies in total")
    posix = [PosixStore(r) for r in roots]
    store = ReplicatedStore(list(posix), hot_reads=0, primary_home=True)
    names = [str(r) for r in roots]
    old: dict[str, list[str]] = {}
    new: dict[str, list[str]] = {}
    added: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    for k in keys:
        key = BlockKey.from_hex(k)
        escaped = _escapes(roots, [p.path(key) for p in posix])
        if escaped:  # a link planted in a root: never read or write through it
            errors[k] = (f"block {k}: its path in {names[escaped[0]]} leads outside that "
                         "root (a symlink); not copied")
            old[k] = new[k] = [names[i] for i in range(len(roots))
                               if i not in escaped and store.stores[i].contains(key)]
            continue
        old[k] = [names[i] for i in store.copies(key) if store.stores[i].contains(key)]
        try:
            held, now = store.replicate(key, min(want, len(roots)))
        except StorageError as err:  # missing or corrupt in the root, or a refused write
            errors[k] = str(err)
            new[k] = old[k]
            continue
        new[k] = [names[i] for i in held]
        added[k] = [names[i] for i in now]
    after: dict[str, Any] = {"blocks": new, "added": added, "roots": names}
    if errors:
        after["errors"] = errors
    return {"blocks": old}, after
