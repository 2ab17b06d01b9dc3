/* dualpath native block reader: batch reads of whole block files, a hashing thread and a
   read-then-hash pipeline, for the page-cache read path (dualpath_cli/storage/native.py).

   A plain C shared library, loaded with ctypes (it defines no Python module and needs no
   Python headers). Built at install time by setup.py as an optional extension
   (dualpath_cli/storage/_native/_reader.<python ABI>.so); where that build did not happen,
   native.py compiles this file at run time into a per-platform cache, or falls back to
   pure-Python reads. It only moves bytes and computes digests: every verdict on a block
   stays in Python. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef uint64_t (*dp_hash_fn)(const void *, size_t);

/* Bump DP_ABI (and _ABI in native.py) whenever a function's signature or meaning changes:
   an installed library of another ABI is not used. */
#ifndef DP_ABI
#define DP_ABI 8
#endif
int dp_abi(void) { return DP_ABI; }

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
