"""Optional native page-cache read path: a batch of block reads in one GIL-free call.

Why: a page-cache read is a CPU copy, and in Python every block costs four calls that drop
and retake the GIL (open, preadv, close, checksum). With two reader threads each retake can
find the other thread holding the GIL, and every such collision is a futex sleep and wake
(25-40 us on this VM) — measured, bare loops of two Python readers reached 0.82 of fio's
rate where the same loop as one C call per batch reached 0.94. This module is that C call:
``dp_read`` opens, reads (finishing short reads, up to the buffer or EOF) and closes each
file of a batch, hashing each payload right after its read, with the GIL released; and
``dp_hasher`` is a C thread that hashes a batch while the caller reads the next one (it
never runs Python, so it never waits for the GIL).

It only *moves bytes and computes digests*; every verdict stays in Python: the header is
parsed and checked by :func:`~dualpath_cli.storage.header.check_header` and a block is
trusted only when the digest computed here equals the one in its (checked) header. The
digest function is xxhash's own exported ``XXH3_64bits`` from the installed ``xxhash``
extension, used only after it reproduced ``xxhash.xxh3_64_intdigest`` on test inputs.

Optional, with a fallback that an operator sees. The C source is
``dualpath_cli/storage/_native/reader.c``; the library is found, in order:

1. built at install time by ``setup.py`` (an optional setuptools extension, so ``pip
   install`` works without a compiler; ``pip install -e .`` builds it in place) as
   ``dualpath_cli/storage/_native/_reader.<python ABI tag>.so``, used when its ``dp_abi()``
   matches this module's;
2. else compiled at run time with the system C compiler into ``$XDG_CACHE_HOME/dualpath``
   (default ``~/.cache/dualpath``), keyed by the source, the ABI, the platform, the
   architecture, the libc and the Python ABI (a shared home directory serves several hosts);
   a cached library that fails to load (truncated, another host's) is rebuilt once;
3. else none: :func:`native_reader` returns None and the store uses the pure-Python path,
   which verifies exactly the same way, only slower. That fallback (and a library without
   a usable digest symbol) is logged once at WARNING, and :func:`native_status` /
   :func:`native_info` say it for ``dualpath storage bench`` and ``bench/storage.py``.

``DUALPATH_NATIVE=0`` turns the native path off on purpose (no warning).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import xxhash

from dualpath_cli.storage.header import _PAYLOAD_LEN_AT, HEADER_SIZE, MAGIC

__all__ = ["NativeReader", "NativeHasher", "NativePipeline", "NativeInfo", "native_reader",
           "native_status", "native_info", "installed_library", "cache_key"]

log = logging.getLogger(__name__)

_ABI = 8  # DP_ABI of _native/reader.c: a library of another ABI is not used


class NativeReader:
    """The loaded library. Thread-safe: each call uses only its own arguments."""

    def __init__(self, lib: ctypes.CDLL, hash_fn: int | None,
                 quick: ctypes.PyDLL | None = None) -> None:
        self._lib = lib
        # calls that never block (submit, try_wait) keep the GIL: a CDLL call drops and retakes
        # it, and with another Python thread runnable each retake can wait for that thread's
        # whole time slice (measured: ~100 us per submit at QD 1, where the copy of an 8 MiB
        # batch takes ~300 us). Blocking calls (read, wait, hash) still release it.
        self._quick = quick if quick is not None else lib
        for fns in {id(lib): lib, id(self._quick): self._quick}.values():
            fns.dp_hasher_submit.restype = ctypes.c_int
            fns.dp_hasher_submit.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                             ctypes.c_void_p, ctypes.c_void_p]
            fns.dp_hasher_try_wait.restype = ctypes.c_int
            fns.dp_hasher_try_wait.argtypes = [ctypes.c_void_p]
        for fns in {id(lib): lib, id(self._quick): self._quick}.values():
            fns.dp_pipe_submit.restype = ctypes.c_void_p
            fns.dp_pipe_submit.argtypes = [ctypes.c_void_p, ctypes.c_int, *[ctypes.c_void_p] * 6]
            fns.dp_pipe_collect.restype = ctypes.c_int
            fns.dp_pipe_collect.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.dp_pipe_new.restype = ctypes.c_void_p
        lib.dp_pipe_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                                    ctypes.c_int64]
        lib.dp_pipe_wait.restype = None
        lib.dp_pipe_wait.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.dp_pipe_free.restype = None
        lib.dp_pipe_free.argtypes = [ctypes.c_void_p]
        lib.dp_hasher_new.restype = ctypes.c_void_p
        lib.dp_hasher_new.argtypes = [ctypes.c_void_p]
        lib.dp_hasher_wait.restype = None
        lib.dp_hasher_wait.argtypes = [ctypes.c_void_p]
        lib.dp_hasher_free.restype = None
        lib.dp_hasher_free.argtypes = [ctypes.c_void_p]
        self._read = lib.dp_read
        self._read.restype = None
        self._read.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 2
        self._hash = lib.dp_hash
        self._hash.restype = None
        self._hash.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p]
        self._hash_fn = hash_fn

    @property
    def hashes(self) -> bool:
        """True when digests are available (a verified xxh3-64 symbol was found)."""
        return self._hash_fn is not None

    def read(self, paths: list[bytes], addrs: list[int], caps: list[int],
             digest: bool = False) -> tuple[list[int], list[int | None]]:
        """Read whole files into the buffers at ``addrs`` (at most ``caps`` bytes each), the
        GIL released for the whole batch. Returns (bytes read or -errno, digest or None) per
        file; with ``digest`` (and :attr:`hashes`), each block's payload is hashed right
        after its read, over the length its (unchecked) header claims."""
        n = len(paths)
        nread = (ctypes.c_int64 * n)()
        hashing = digest and self._hash_fn is not None
        digests = (ctypes.c_uint64 * n)() if hashing else None
        hashed = (ctypes.c_uint8 * n)() if hashing else None
        self._read(n, (ctypes.c_char_p * n)(*paths), (ctypes.c_void_p * n)(*addrs),
                   (ctypes.c_int64 * n)(*caps), nread, digests, hashed,
                   self._hash_fn if hashing else None, MAGIC, _PAYLOAD_LEN_AT, HEADER_SIZE)
        if digests is None or hashed is None:
            return list(nread), [None] * n
        return list(nread), [d if h else None for d, h in zip(digests, hashed, strict=True)]

    def hasher(self) -> NativeHasher | None:
        """A hashing thread of its own (no Python runs on it), or None without digests."""
        if self._hash_fn is None:
            return None
        handle = self._lib.dp_hasher_new(self._hash_fn)
        return NativeHasher(self._lib, self._quick, handle) if handle else None

    def pipeline(self) -> NativePipeline | None:
        """A read-then-hash pipeline of its own (two C threads), or None without digests."""
        if self._hash_fn is None:
            return None
        handle = self._lib.dp_pipe_new(self._hash_fn, MAGIC, _PAYLOAD_LEN_AT, HEADER_SIZE)
        return NativePipeline(self._lib, self._quick, handle) if handle else None

    def digests(self, addrs: list[int], lens: list[int]) -> list[int]:
        """xxh3-64 of ``lens[i]`` bytes at ``addrs[i]``, the GIL released for the batch."""
        assert self._hash_fn is not None
        n = len(addrs)
        out = (ctypes.c_uint64 * n)()
        self._hash(n, (ctypes.c_void_p * n)(*addrs), (ctypes.c_int64 * n)(*lens), out,
                   self._hash_fn)
        return list(out)


class NativeHasher:
    """A C thread hashing one batch at a time while the caller's thread reads the next.

    It never runs Python, so handing it a batch costs one condition-variable signal and it
    never waits for the GIL (a Python helper thread waited for it around every payload).
    Use from one thread; :meth:`close` when done.
    """

    def __init__(self, lib: ctypes.CDLL, quick: ctypes.CDLL, handle: int) -> None:
        self._lib = lib
        self._quick = quick  # the same functions, called without releasing the GIL
        self._handle: int | None = handle
        self._arrays: tuple[object, object, ctypes.Array[ctypes.c_uint64]] | None = None

    @property
    def busy(self) -> bool:
        """True while a submitted batch has not been collected with :meth:`wait`."""
        return self._arrays is not None

    def submit(self, addrs: list[int], lens: list[int]) -> None:
        """Start hashing ``lens[i]`` bytes at ``addrs[i]`` (the memory must stay valid until
        :meth:`wait`); one batch at a time."""
        if self._arrays is not None:
            raise RuntimeError("a batch is already being hashed")
        n = len(addrs)
        ptrs, lengths, out = ((ctypes.c_void_p * n)(*addrs), (ctypes.c_int64 * n)(*lens),
                              (ctypes.c_uint64 * n)())
        if self._quick.dp_hasher_submit(self._handle, n, ptrs, lengths, out) != 0:
            raise RuntimeError("native hasher busy")
        self._arrays = (ptrs, lengths, out)

    def wait(self) -> list[int]:
        """The digests of the submitted batch, in order (waits, GIL released)."""
        if self._arrays is None:
            return []
        if not self._quick.dp_hasher_try_wait(self._handle):  # usually done: no GIL trip
            self._lib.dp_hasher_wait(self._handle)
        out = self._arrays[2]
        self._arrays = None
        return list(out)

    def close(self) -> None:
        """Stop the thread (after the outstanding batch). Idempotent."""
        if self._handle is not None:
            self._lib.dp_hasher_free(self._handle)
            self._handle = None
            self._arrays = None


class PipeJob:
    """A batch submitted to a :class:`NativePipeline`: its arrays live until it is collected."""

    __slots__ = ("handle", "arrays")

    def __init__(self, handle: int, arrays: tuple[object, ...]) -> None:
        self.handle = handle
        self.arrays = arrays


class NativePipeline:
    """Two C threads, a reader and a hasher, working through submitted batches in order.

    Why: with one reader thread doing the reads in Python's stead and another hashing, the
    caller's thread (which checks headers, compares digests and hands blocks out, all in
    Python) runs beside the copy instead of between copies. At queue depth 1 on two cores
    that leaves one core copying without pause, like fio's single job, and the hash and the
    Python on the other. Use from one thread; :meth:`close` when done.
    """

    def __init__(self, lib: ctypes.CDLL, quick: ctypes.CDLL, handle: int) -> None:
        self._lib = lib
        self._quick = quick  # submit and collect never block: they keep the GIL
        self._handle: int | None = handle
        self._outstanding: dict[int, PipeJob] = {}

    def submit(self, paths: list[bytes], addrs: list[int], caps: list[int]) -> PipeJob:
        """Queue reads of whole files into the buffers at ``addrs`` (at most ``caps`` bytes
        each; the buffers must stay valid until :meth:`collect`)."""
        if self._handle is None:
            raise RuntimeError("pipeline is closed")
        n = len(paths)
        arrays = ((ctypes.c_char_p * n)(*paths), (ctypes.c_void_p * n)(*addrs),
                  (ctypes.c_int64 * n)(*caps), (ctypes.c_int64 * n)(),
                  (ctypes.c_uint64 * n)(), (ctypes.c_uint8 * n)())
        handle = self._quick.dp_pipe_submit(self._handle, n, *arrays)
        if not handle:
            raise MemoryError("native pipeline: no memory for a job")
        job = PipeJob(handle, arrays)
        self._outstanding[handle] = job
        return job

    def collect(self, job: PipeJob) -> tuple[list[int], list[int | None]]:
        """Wait for ``job`` (GIL released only when it is not done yet); returns, per file,
        bytes read or -errno, and the digest of the payload length its (unchecked) header
        claims, or None when it was not hashed (no magic, or a claim beyond the bytes read)."""
        if self._outstanding.pop(job.handle, None) is None:
            raise RuntimeError("job is not outstanding")
        if not self._quick.dp_pipe_collect(self._handle, job.handle):
            self._lib.dp_pipe_wait(self._handle, job.handle)
        _, _, _, nread, digests, hashed = job.arrays
        return (list(nread),  # type: ignore[call-overload]
                [d if h else None for d, h in zip(digests, hashed, strict=True)])  # type: ignore[call-overload]

    def close(self) -> None:
        """Collect what is outstanding and stop both threads. Idempotent."""
        if self._handle is None:
            return
        for job in list(self._outstanding.values()):
            self.collect(job)
        self._lib.dp_pipe_free(self._handle)
        self._handle = None


_SOURCE = Path(__file__).parent / "_native" / "reader.c"
_EXTENSION = "dualpath_cli.storage._native._reader"  # built by setup.py (never imported)


@dataclass(frozen=True, slots=True)
class NativeInfo:
    """Where the native read path stands, for status and bench output."""

    available: bool
    digests: bool
    origin: str | None  # "installed" (built by setup.py), "runtime-build", or None
    path: str | None  # the library loaded
    status: str  # one line for humans

    def as_dict(self) -> dict[str, object]:
        """JSON form."""
        return {"available": self.available, "digests": self.digests, "origin": self.origin,
                "path": self.path, "status": self.status}


_info = NativeInfo(False, False, None, None, "not loaded")
_lock = threading.Lock()
_warned = False


def native_status() -> str:
    """Why the native path is (not) in use, for ``storage bench`` and diagnostics."""
    return native_info().status


def native_info() -> NativeInfo:
    """Where the native path stands (loading it first if not tried yet)."""
    native_reader()
    return _info


@lru_cache(maxsize=1)
def native_reader() -> NativeReader | None:
    """The native reader, found (or built) and checked once per process; None when
    unavailable. Falling back to Python is logged once at WARNING."""
    global _info
    with _lock:
        if os.environ.get("DUALPATH_NATIVE", "1") == "0":
            _info = NativeInfo(False, False, None, None, "disabled (DUALPATH_NATIVE=0)")
            return None
        tried: list[str] = []
        found = _load_installed(tried) or _load_runtime_build(tried)
        if found is None:
            _info = NativeInfo(False, False, None, None,
                               f"unavailable ({'; '.join(tried)}): pure-Python reads")
            _warn(f"native read path unavailable ({'; '.join(tried)}); block reads and "
                  "checksums run in Python (slower)")
            return None
        (lib, quick), origin, path = found
        reader = NativeReader(lib, _xxh3_symbol(), quick)
        if reader.hashes and not _digests_agree(reader):
            reader = NativeReader(lib, None, quick)
        where = "built at install" if origin == "installed" else f"built at run time: {path}"
        if reader.hashes:
            status = f"native reads and digests ({where})"
        else:
            status = f"native reads, Python digests (no usable xxh3 symbol; {where})"
            _warn("native read path has no usable xxh3-64 symbol in the installed xxhash; "
                  "payload checksums run in Python (slower)")
        _info = NativeInfo(True, reader.hashes, origin, str(path), status)
        return reader


def _warn(message: str) -> None:
    """Log a fallback once per process at WARNING (an operator must see it)."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("%s", message)


_Libs = tuple[ctypes.CDLL, ctypes.PyDLL]


def _open(path: Path) -> _Libs:
    """Load the library twice over (GIL-releasing and GIL-keeping calls); raises OSError
    when it does not load and RuntimeError when its ABI is not this module's."""
    lib, quick = ctypes.CDLL(str(path)), ctypes.PyDLL(str(path))
    try:
        abi_fn = lib.dp_abi
    except AttributeError:
        raise RuntimeError(f"{path.name} has no dp_abi (an older build)") from None
    abi_fn.restype = ctypes.c_int
    abi_fn.argtypes = []
    abi = abi_fn()
    if abi != _ABI:
        raise RuntimeError(f"{path.name} has ABI {abi}, this dualpath needs {_ABI}")
    return lib, quick


def installed_library() -> Path | None:
    """The library setup.py built at install (or ``pip install -e .`` in place), if any."""
    try:
        spec = importlib.util.find_spec(_EXTENSION)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _load_installed(tried: list[str]) -> tuple[_Libs, str, Path] | None:
    path = installed_library()
    if path is None:
        tried.append("not built at install")
        return None
    try:
        return _open(path), "installed", path
    except (OSError, RuntimeError) as err:
        tried.append(f"installed library unusable: {err}")
        log.info("installed native library %s unusable: %s", path, err)
        return None


def _load_runtime_build(tried: list[str]) -> tuple[_Libs, str, Path] | None:
    """Compile into the cache (once per key) and load; a cached library that fails to load
    is removed and rebuilt once."""
    try:
        path = _build()
        try:
            return _open(path), "runtime-build", path
        except OSError as err:
            log.info("cached native library %s failed to load (%s): rebuilding", path, err)
            path.unlink(missing_ok=True)
            path = _build()
            return _open(path), "runtime-build", path
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as err:
        # no compiler, a failed or slow build, a read-only cache, no home: fall back
        tried.append(f"runtime build: {err}")
        return None


def cache_key() -> str:
    """What a runtime-built library depends on: the source and ABI, the platform, the
    architecture, the libc and the Python ABI (the cache may be a shared home directory)."""
    libc, libc_version = platform.libc_ver()
    return "\0".join([str(_ABI), _SOURCE.read_text(), sysconfig.get_platform(),
                      platform.machine(), f"{libc or 'unknown-libc'}-{libc_version}",
                      sys.implementation.cache_tag or "",
                      str(sysconfig.get_config_var("SOABI") or "")])


def _library_path() -> Path:
    """Where the runtime build for this host lives in the cache."""
    tag = hashlib.sha256(cache_key().encode()).hexdigest()[:16]
    libc, libc_version = platform.libc_ver()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dualpath"
    suffix = sysconfig.get_config_var("SHLIB_SUFFIX") or ".so"
    host = f"{platform.machine() or 'unknown'}-{libc or 'libc'}{libc_version}"
    return cache / f"dp_native_{host}_{tag}{suffix}"


def _build() -> Path:
    """Compile the source into the cache directory (once per key); returns the library."""
    lib = _library_path()
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = shutil.which(cc.split()[0]) if cc else None
    if compiler is None:
        raise RuntimeError(f"no C compiler ({cc.split()[0] if cc else 'cc'} not found)")
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        out = Path(tmp) / lib.name
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(out),
                               str(_SOURCE)],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"C build failed: {done.stderr.strip()[:200]}")
        os.replace(out, lib)  # atomic: concurrent builders race harmlessly
    return lib


def _xxh3_symbol() -> int | None:
    """Address of xxhash's exported one-shot XXH3-64 (the CPU-dispatching one if present)."""
    try:  # the extension module's own file: its exported symbols
        file = importlib.import_module("xxhash._xxhash").__file__
        if file is None:
            return None
        ext = ctypes.CDLL(file)
    except (ImportError, AttributeError, OSError):
        return None
    for name in ("XXH3_64bits_dispatch", "XXH3_64bits"):
        fn = getattr(ext, name, None)
        if fn is not None:
            return ctypes.cast(fn, ctypes.c_void_p).value
    return None


def _digests_agree(reader: NativeReader) -> bool:
    """The symbol must give exactly xxhash.xxh3_64_intdigest (seed 0) on varied inputs."""
    sizes = (0, 1, 100, 4096, (64 << 10) + 3, 1 << 20)
    blobs = [ctypes.create_string_buffer(os.urandom(n), n) for n in sizes]
    got = reader.digests([ctypes.addressof(b) for b in blobs], list(sizes))
    want = [xxhash.xxh3_64_intdigest(bytes(b)) for b in blobs]
    return got == want
