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

Optional with a clean fallback: the C source below is compiled on first use with the system
C compiler into ``$XDG_CACHE_HOME/dualpath`` (default ``~/.cache/dualpath``); with no
compiler, a failed build, no usable digest symbol, or ``DUALPATH_NATIVE=0``,
:func:`native_reader` returns None (or a reader without digests) and the store uses the
pure-Python path, which verifies exactly the same way.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

import xxhash

from dualpath_cli.storage.header import _PAYLOAD_LEN_AT, HEADER_SIZE, MAGIC

__all__ = ["NativeReader", "NativeHasher", "NativePipeline", "native_reader", "native_status"]

log = logging.getLogger(__name__)

_SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef uint64_t (*dp_hash_fn)(const void *, size_t);

/* If buf (done bytes read) starts with `magic` (8 bytes) and the payload length its header
   claims (u64 at `len_at`) was read whole after the `header`-byte header: *digest = hash of
   that many payload bytes, returns 1; else 0. */
static int dp_hash_claimed(const char *buf, int64_t done, uint64_t *digest, dp_hash_fn hash,
                           const char *magic, int64_t len_at, int64_t header) {
    if (done < header || memcmp(buf, magic, 8) != 0) return 0;
    uint64_t len;
    memcpy(&len, buf + len_at, sizeof len);
    if (len > (uint64_t)(done - header)) return 0;
    *digest = hash(buf + header, (size_t)len);
    return 1;
}

/* For each i: open paths[i], read it from offset 0 into bufs[i] until caps[i] bytes or EOF
   (short reads are continued, EINTR retried), close it; nread[i] = bytes read or -errno.
   With a hash function, right after each read (the bytes still in this core's cache): if the
   buffer starts with `magic` (8 bytes) and the payload length the header claims (u64 at
   `len_at`) was read whole after the `header`-byte header, digests[i] = hash of that many
   payload bytes and hashed[i] = 1, else hashed[i] = 0. The claim is not trusted here: the
   caller checks the header and compares the digest with it. */
void dp_read(int n, const char **paths, char **bufs, const int64_t *caps, int64_t *nread,
             uint64_t *digests, uint8_t *hashed, dp_hash_fn hash, const char *magic,
             int64_t len_at, int64_t header) {
    for (int i = 0; i < n; i++) {
        if (hashed) hashed[i] = 0;
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) { nread[i] = -errno; continue; }
        int64_t done = 0;
        while (done < caps[i]) {
            ssize_t got = pread(fd, bufs[i] + done, (size_t)(caps[i] - done), done);
            if (got < 0) { if (errno == EINTR) continue; done = -errno; break; }
            if (got == 0) break;
            done += got;
        }
        close(fd);
        nread[i] = done;
        if (hash) hashed[i] = dp_hash_claimed(bufs[i], done, &digests[i], hash, magic, len_at,
                                              header);
    }
}

/* digests[i] = hash(ptrs[i], lens[i]) */
void dp_hash(int n, char **ptrs, const int64_t *lens, uint64_t *digests, dp_hash_fn hash) {
    for (int i = 0; i < n; i++) digests[i] = hash(ptrs[i], (size_t)lens[i]);
}

/* A hashing thread that never touches Python: one batch at a time is submitted (the
   caller keeps ptrs, lens and digests alive until dp_hasher_wait returns). */
typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int state; /* 0 idle, 1 submitted, 2 hashed, 3 stop */
    int n;
    char **ptrs;
    const int64_t *lens;
    uint64_t *digests;
    dp_hash_fn hash;
} dp_hasher;

static void *dp_hasher_main(void *arg) {
    dp_hasher *h = arg;
    pthread_setname_np(pthread_self(), "dp-hasher");
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->state != 1 && h->state != 3) pthread_cond_wait(&h->work, &h->mu);
        if (h->state == 3) break;
        pthread_mutex_unlock(&h->mu);
        for (int i = 0; i < h->n; i++) h->digests[i] = h->hash(h->ptrs[i], (size_t)h->lens[i]);
        pthread_mutex_lock(&h->mu);
        h->state = 2;
        pthread_cond_signal(&h->done);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

dp_hasher *dp_hasher_new(dp_hash_fn hash) {
    dp_hasher *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->hash = hash;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->work, NULL);
    pthread_cond_init(&h->done, NULL);
    if (pthread_create(&h->thread, NULL, dp_hasher_main, h) != 0) { free(h); return NULL; }
    return h;
}

/* 0, or -1 when a batch is still outstanding (wait for it first) */
int dp_hasher_submit(dp_hasher *h, int n, char **ptrs, const int64_t *lens, uint64_t *digests) {
    pthread_mutex_lock(&h->mu);
    if (h->state == 1 || h->state == 2) { pthread_mutex_unlock(&h->mu); return -1; }
    h->n = n; h->ptrs = ptrs; h->lens = lens; h->digests = digests; h->state = 1;
    pthread_cond_signal(&h->work);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

/* dp_hasher_wait when the outstanding batch is already hashed (returns 1), else 0 at
   once; never blocks on the hashing */
int dp_hasher_try_wait(dp_hasher *h) {
    pthread_mutex_lock(&h->mu);
    int ready = h->state != 1;
    if (ready) h->state = 0;
    pthread_mutex_unlock(&h->mu);
    return ready;
}

/* wait until the outstanding batch is hashed (returns at once when none is) */
void dp_hasher_wait(dp_hasher *h) {
    pthread_mutex_lock(&h->mu);
    while (h->state == 1) pthread_cond_wait(&h->done, &h->mu);
    h->state = 0;
    pthread_mutex_unlock(&h->mu);
}

void dp_hasher_free(dp_hasher *h) {
    dp_hasher_wait(h);
    pthread_mutex_lock(&h->mu);
    h->state = 3;
    pthread_cond_signal(&h->work);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->work);
    pthread_cond_destroy(&h->done);
    free(h);
}

/* A read-then-hash pipeline of two threads that never run Python: the reader reads each
   submitted job's files in turn (as dp_read does, one read at a time) and hands the job to
   the hasher, which hashes each payload as dp_read would inline; the caller submits jobs
   and collects them in order. The caller's thread is free while both run, so its per-block
   checks overlap the next job's reads. The caller keeps a job's arrays alive until it is
   collected. */
typedef struct dp_job {
    int n;
    const char **paths;
    char **bufs;
    const int64_t *caps;
    int64_t *nread;
    uint64_t *digests;
    uint8_t *hashed;
    int state; /* 0 queued, 1 read, 2 hashed */
    struct dp_job *next;
} dp_job;

typedef struct {
    pthread_t reader, hasher;
    pthread_mutex_t mu;
    pthread_cond_t to_read, to_hash, hashed;
    dp_job *read_head, *read_tail, *hash_head, *hash_tail;
    int stop_reader, stop_hasher;
    dp_hash_fn hash;
    char magic[8];
    int64_t len_at, header;
} dp_pipe;

static void *dp_pipe_reader(void *arg) {
    dp_pipe *p = arg;
    pthread_setname_np(pthread_self(), "dp-pipe-read");
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->read_head && !p->stop_reader) pthread_cond_wait(&p->to_read, &p->mu);
        dp_job *job = p->read_head;
        if (!job) break; /* stopped and drained */
        p->read_head = job->next;
        if (!p->read_head) p->read_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        dp_read(job->n, job->paths, job->bufs, job->caps, job->nread, NULL, NULL, NULL,
                NULL, 0, 0);
        pthread_mutex_lock(&p->mu);
        job->state = 1;
        job->next = NULL;
        if (p->hash_tail) p->hash_tail->next = job; else p->hash_head = job;
        p->hash_tail = job;
        pthread_cond_signal(&p->to_hash);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void *dp_pipe_hasher(void *arg) {
    dp_pipe *p = arg;
    pthread_setname_np(pthread_self(), "dp-pipe-hash");
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->hash_head && !p->stop_hasher) pthread_cond_wait(&p->to_hash, &p->mu);
        dp_job *job = p->hash_head;
        if (!job) break;
        p->hash_head = job->next;
        if (!p->hash_head) p->hash_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < job->n; i++)
            job->hashed[i] = dp_hash_claimed(job->bufs[i], job->nread[i], &job->digests[i],
                                             p->hash, p->magic, p->len_at, p->header);
        pthread_mutex_lock(&p->mu);
        job->state = 2;
        pthread_cond_broadcast(&p->hashed);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* tell one of the pipeline's threads to stop once its queue is drained, and join it */
static void dp_pipe_stop(dp_pipe *p, int *stop, pthread_cond_t *wake, pthread_t thread) {
    pthread_mutex_lock(&p->mu);
    *stop = 1;
    pthread_cond_signal(wake);
    pthread_mutex_unlock(&p->mu);
    pthread_join(thread, NULL);
}

dp_pipe *dp_pipe_new(dp_hash_fn hash, const char *magic, int64_t len_at, int64_t header) {
    dp_pipe *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->hash = hash;
    memcpy(p->magic, magic, 8);
    p->len_at = len_at;
    p->header = header;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->to_read, NULL);
    pthread_cond_init(&p->to_hash, NULL);
    pthread_cond_init(&p->hashed, NULL);
    if (pthread_create(&p->reader, NULL, dp_pipe_reader, p) != 0) { free(p); return NULL; }
    if (pthread_create(&p->hasher, NULL, dp_pipe_hasher, p) != 0) {
        dp_pipe_stop(p, &p->stop_reader, &p->to_read, p->reader);
        free(p);
        return NULL;
    }
    return p;
}

/* queue a job; the arrays must stay valid until dp_pipe_collect/dp_pipe_wait returned it */
dp_job *dp_pipe_submit(dp_pipe *p, int n, const char **paths, char **bufs,
                       const int64_t *caps, int64_t *nread, uint64_t *digests,
                       uint8_t *hashed) {
    dp_job *job = calloc(1, sizeof *job);
    if (!job) return NULL;
    job->n = n; job->paths = paths; job->bufs = bufs; job->caps = caps;
    job->nread = nread; job->digests = digests; job->hashed = hashed;
    pthread_mutex_lock(&p->mu);
    if (p->read_tail) p->read_tail->next = job; else p->read_head = job;
    p->read_tail = job;
    pthread_cond_signal(&p->to_read);
    pthread_mutex_unlock(&p->mu);
    return job;
}

/* 1 and the job freed when it is hashed, else 0 at once (never blocks) */
int dp_pipe_collect(dp_pipe *p, dp_job *job) {
    pthread_mutex_lock(&p->mu);
    int ready = job->state == 2;
    pthread_mutex_unlock(&p->mu);
    if (ready) free(job);
    return ready;
}

/* wait until the job is hashed, then free it */
void dp_pipe_wait(dp_pipe *p, dp_job *job) {
    pthread_mutex_lock(&p->mu);
    while (job->state != 2) pthread_cond_wait(&p->hashed, &p->mu);
    pthread_mutex_unlock(&p->mu);
    free(job);
}

/* stop after every submitted job is done (collect each one first: a job is freed only by
   dp_pipe_collect or dp_pipe_wait) */
void dp_pipe_free(dp_pipe *p) {
    dp_pipe_stop(p, &p->stop_reader, &p->to_read, p->reader);
    dp_pipe_stop(p, &p->stop_hasher, &p->to_hash, p->hasher);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->to_read);
    pthread_cond_destroy(&p->to_hash);
    pthread_cond_destroy(&p->hashed);
    free(p);
}
"""

_ABI = 7  # bump when the C functions' signatures change (part of the cache key)


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


_status = "not loaded"
_lock = threading.Lock()


def native_status() -> str:
    """Why the native path is (not) in use, for ``storage bench`` and diagnostics."""
    native_reader()
    return _status


@lru_cache(maxsize=1)
def native_reader() -> NativeReader | None:
    """The native reader, built and checked once per process; None when unavailable."""
    global _status
    with _lock:
        if os.environ.get("DUALPATH_NATIVE", "1") == "0":
            _status = "disabled (DUALPATH_NATIVE=0)"
            return None
        try:
            path = str(_build())
            lib, quick = ctypes.CDLL(path), ctypes.PyDLL(path)
        except Exception as err:  # no compiler, read-only cache, odd platform: fall back
            _status = f"unavailable ({err})"
            log.debug("native read path unavailable: %s", err)
            return None
        reader = NativeReader(lib, _xxh3_symbol(), quick)
        if reader.hashes and not _digests_agree(reader):
            reader = NativeReader(lib, None, quick)
        _status = "native reads and digests" if reader.hashes else "native reads"
        return reader


def _build() -> Path:
    """Compile the source into the cache directory (once per source and ABI)."""
    tag = hashlib.sha256(f"{_ABI}\0{_SOURCE}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dualpath"
    lib = cache / f"dp_native_{tag}{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = shutil.which(cc.split()[0]) if cc else None
    if compiler is None:
        raise RuntimeError("no C compiler")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src = Path(tmp) / "dp_native.c"
        src.write_text(_SOURCE)
        out = Path(tmp) / lib.name
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(out),
                               str(src)],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"C build failed: {done.stderr.strip()[:200]}")
        os.replace(out, lib)  # atomic: concurrent builders race harmlessly
    return lib


def _xxh3_symbol() -> int | None:
    """Address of xxhash's exported one-shot XXH3-64 (the CPU-dispatching one if present)."""
    try:
        ext = ctypes.CDLL(xxhash._xxhash.__file__)  # type: ignore[attr-defined]
    except Exception:
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
