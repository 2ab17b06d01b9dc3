"""KV-cache block storage: stores (POSIX files, in-memory fake, replicated), codecs, and the
per-node StorageLoader (queued, prioritised, bandwidth-shaped, with a DRAM buffer cache).

Public API (everything else is private)::

    from dualpath_cli.storage import PosixStore, StorageLoader, encode_block
    store = PosixStore("/mnt/3fs/kv", direct=True)
    store.put(*encode_block(key, full_block, namespace))
    with StorageLoader(store, node=0, shaping_bps=50e9, cache_bytes=8 << 30) as loader:
        result = loader.load(keys)       # result.blocks[i] is a LoadedBlock or None (miss)
"""

from dualpath_cli.storage.block import LoadedBlock, encode_block
from dualpath_cli.storage.buffers import BlockBuffer, BufferPool
from dualpath_cli.storage.cache import BlockCache
from dualpath_cli.storage.codecs import CODECS, DTYPES, Codec, CodecReport, codec_report, get_codec
from dualpath_cli.storage.engines import ENGINES, make_engine, uring_status
from dualpath_cli.storage.errors import (
    CapacityError,
    ChecksumMismatch,
    CorruptBlockError,
    ForeignHeader,
    StorageError,
    StorageUsageError,
    TruncatedBlock,
)
from dualpath_cli.storage.header import HEADER_SIZE, BlockHeader
from dualpath_cli.storage.loader import PREFETCH_PRIORITY, StorageLoader
from dualpath_cli.storage.memory import MemoryStore
from dualpath_cli.storage.posix import PosixStore
from dualpath_cli.storage.replicas import ReplicatedStore
from dualpath_cli.storage.shaper import TokenBucket
from dualpath_cli.storage.store import (
    BoundedReads,
    GcReport,
    KVStore,
    PipelinedReads,
    ReadOp,
    ReadPath,
    ReadPathStore,
    SplitReads,
    StoreUsage,
    read_one,
    verify_block,
)
from dualpath_cli.storage.tickets import LoadResult, LoadTicket, ReadQueue

__all__ = [
    "KVStore", "PosixStore", "MemoryStore", "ReplicatedStore", "ReadOp", "StoreUsage",
    "GcReport", "read_one", "verify_block",
    "ReadPath", "ReadPathStore", "BoundedReads", "SplitReads", "PipelinedReads",
    "StorageLoader", "LoadTicket", "LoadResult", "ReadQueue", "PREFETCH_PRIORITY",
    "LoadedBlock", "encode_block", "BlockHeader", "HEADER_SIZE",
    "BlockBuffer", "BufferPool", "BlockCache", "TokenBucket",
    "CODECS", "DTYPES", "Codec", "CodecReport", "codec_report", "get_codec",
    "ENGINES", "make_engine", "uring_status",
    "StorageError", "StorageUsageError", "CorruptBlockError", "ChecksumMismatch",
    "TruncatedBlock", "ForeignHeader", "CapacityError",
]
