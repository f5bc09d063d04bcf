/*
 * ckpt_file.c - a server's checkpoint file ([server] checkpoint_dir, resume): its format,
 * written from the parameter chunks' state (param.c's) and read back at start-up.
 *
 * THE FILE (one per server: <checkpoint_dir>/psagg-server-<rank>.ckpt), little-endian:
 *   ckpt_head (120 bytes: magic "PSAGGCKP", format version, server rank, servers, optimizer,
 *     tensors, chunks, chunk_elems, when, job id, the checkpoint's sequence)
 *   n_tensors x psagg__ctl_tensor: the job's declaration, as the workers sent it
 *   per owned parameter chunk, in slot order: ckpt_chunk (32 bytes: key, chunk, count,
 *     step, round, arrays) + arrays x count binary32: w, view, then the optimizer's state
 *   32 bytes: BLAKE2b-256 (libsodium's crypto_generichash) of everything before.
 * A checkpoint is written in two phases (checkpoint.c): PREPARE writes <file>.pending (to a
 * temporary name, synced and renamed), stamped with the checkpoint's sequence; COMMIT, which a
 * worker sends only once every server it asked prepared, keeps the current file as <file>.prev
 * and puts the pending one in place. So a call that failed anywhere leaves the checkpoint
 * before it whole, and a crash leaves the previous files.
 * At start-up (resume) the whole file is checked (size, checksum, every length) before any
 * of it is believed; when the declaration is known, it must match the file's exactly, chunk
 * by chunk, before anything is loaded.
 *
 * With [cluster] server_replicas a chunk may have moved: each server writes the chunks it owns
 * in the view it applied (a taken-over one too; a copy, which may lag its owner, writes
 * nothing), and a resumed server reads every server's file it finds in its checkpoint_dir and
 * takes each chunk it holds (owned or copied) from the newest checkpoint (sequence) that holds
 * every parameter chunk of the job in some file, current or previous: a dead server's file is
 * older than the new owner's, and a commit cut short by a death falls back to the checkpoint
 * before. So every file must be in every server's checkpoint_dir (a shared directory, or
 * copied there); a chunk found in no checkpoint is named.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "server.h"

#define CKPT_MAGIC   "PSAGGCKP"
#define CKPT_VERSION 2u
#define CKPT_SUM     32 /* BLAKE2b-256 */

typedef struct ckpt_head {
    char magic[8];
    uint32_t version;
    uint32_t server_rank;
    uint32_t n_servers;
    uint32_t optimizer; /* psagg__optim_kind */
    uint32_t n_tensors;
    uint32_t n_chunks; /* chunk records that follow the declaration */
    uint64_t chunk_elems;
    int64_t written_ns; /* CLOCK_REALTIME */
    char job_id[64];
    uint64_t sequence; /* the checkpoint's (the asking worker's clock: psagg__ctl_checkpoint) */
} ckpt_head;
_Static_assert(sizeof(ckpt_head) == 120, "ckpt_head layout");

/* (4-byte aligned only: a record follows the binary32 arrays of the one before, whose count
   may be odd, so the compiler must not assume its 64-bit fields 8-byte aligned) */
typedef struct __attribute__((packed, aligned(4))) ckpt_chunk {
    uint32_t key, index;
    uint64_t count;
    uint64_t step;
    uint32_t round;
    uint32_t arrays; /* binary32 arrays of count elements that follow */
} ckpt_chunk;
_Static_assert(sizeof(ckpt_chunk) == 32, "ckpt_chunk layout");

/* One server's file, mapped read-only and checked. */
typedef struct ckpt_map {
    char path[PATH_MAX];
    const uint8_t *base;
    size_t size;
    const ckpt_head *head;
    const psagg__ctl_tensor *decl;
    const ckpt_chunk **chunks; /* head->n_chunks records, in file order */
} ckpt_map;

/* The checkpoint a resumed server reads: its own file, or with server replicas every server's
   it finds; and where each held chunk's record is. */
struct ckpt_file {
    char path[PATH_MAX + 32]; /* for the log: the file, or "DIR (N files)" */
    ckpt_map *maps;
    int n_maps;
    const ckpt_chunk **by_slot; /* after optim_check_job: per held slot, or NULL */
};

void ckpt_path(const server *srv, int rank, const char *suffix, char *buf, size_t len)
{
    snprintf(buf, len, "%s/psagg-server-%d.ckpt%s", srv->cfg.checkpoint_dir, rank, suffix);
}

static void map_close(ckpt_map *f)
{
    if (f->base)
        munmap((void *)f->base, f->size);
    free(f->chunks);
    memset(f, 0, sizeof *f);
}

void ckpt_close(struct ckpt_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_maps; i++)
        map_close(&f->maps[i]);
    free(f->maps);
    free(f->by_slot);
    free(f);
}

/* Map `path`, server `rank`'s file, and check all of it: size, checksum, header, and every
   record's bounds. */
static psagg_status ckpt_read(const server *srv, const char *path, int rank, ckpt_map *f)
{
    uint8_t sum[CKPT_SUM];
    struct stat sb;
    size_t off;
    int fd;
    psagg_status st = PSAGG_OK;

    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = psagg__fail(PSAGG_EIO, "[server] resume: checkpoint %s cannot be opened: %s", path,
                         strerror(errno));
        goto err;
    }
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        st = psagg__fail(PSAGG_EIO, "[server] resume: checkpoint %s is not a regular file", path);
        goto err;
    }
    f->size = (size_t)sb.st_size;
    if (f->size < sizeof(ckpt_head) + CKPT_SUM) {
        close(fd);
        st = psagg__fail(PSAGG_EIO,
                         "[server] resume: checkpoint %s has %zu bytes, less than a header and a "
                         "checksum: torn (a write cut short) or not a checkpoint",
                         path, f->size);
        goto err;
    }
    f->base = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->base == MAP_FAILED) {
        f->base = NULL;
        st = psagg__fail(PSAGG_EIO, "[server] resume: checkpoint %s cannot be mapped: %s", path,
                         strerror(errno));
        goto err;
    }
    f->head = (const ckpt_head *)f->base;
    if (memcmp(f->head->magic, CKPT_MAGIC, 8)) {
        st = psagg__fail(PSAGG_EIO, "[server] resume: %s is not a psagg checkpoint (magic)", path);
        goto err;
    }
    if (f->head->version != CKPT_VERSION) {
        st = psagg__fail(PSAGG_EIO,
                         "[server] resume: checkpoint %s has format version %u; this server reads "
                         "version %u",
                         path, f->head->version, CKPT_VERSION);
        goto err;
    }
    if (sodium_init() < 0 ||
        crypto_generichash(sum, sizeof sum, f->base, f->size - CKPT_SUM, NULL, 0) ||
        sodium_memcmp(sum, f->base + f->size - CKPT_SUM, CKPT_SUM)) {
        st = psagg__fail(PSAGG_EIO,
                         "[server] resume: checkpoint %s: its checksum does not match its "
                         "contents: torn or damaged, nothing loaded",
                         path);
        goto err;
    }
    if (f->head->server_rank != (uint32_t)rank ||
        f->head->n_servers != (uint32_t)srv->cfg.n_servers) {
        st = psagg__fail(PSAGG_EIO,
                         "[server] resume: checkpoint %s was written by server %u of %u; it "
                         "should be server %d's of %d",
                         path, f->head->server_rank, f->head->n_servers, rank, srv->cfg.n_servers);
        goto err;
    }
    off = sizeof(ckpt_head);
    if (f->head->n_tensors == 0 || f->head->n_tensors > PSAGG_MAX_TENSORS ||
        (f->size - CKPT_SUM - off) / sizeof(psagg__ctl_tensor) < f->head->n_tensors ||
        f->head->n_chunks > PSAGG_MAX_CHUNKS) {
        st = psagg__fail(PSAGG_EIO,
                         "[server] resume: checkpoint %s: field n_tensors/n_chunks is "
                         "out of range for its size",
                         path);
        goto err;
    }
    f->decl = (const psagg__ctl_tensor *)(f->base + off);
    off += (size_t)f->head->n_tensors * sizeof(psagg__ctl_tensor);
    f->chunks = calloc(f->head->n_chunks ? f->head->n_chunks : 1, sizeof *f->chunks);
    if (!f->chunks) {
        st = psagg__fail(PSAGG_ENOMEM, "checkpoint %s", path);
        goto err;
    }
    for (uint32_t i = 0; i < f->head->n_chunks; i++) {
        const ckpt_chunk *c = (const ckpt_chunk *)(f->base + off);
        size_t left = f->size - CKPT_SUM - off;
        if (left < sizeof *c || c->arrays < 2 || c->arrays > 4 || !c->count ||
            c->count > (uint64_t)PSAGG_MAX_CHUNK_ELEMS ||
            (left - sizeof *c) / 4 / c->arrays < c->count) {
            st = psagg__fail(PSAGG_EIO,
                             "[server] resume: checkpoint %s: chunk record %u is out of bounds",
                             path, i);
            goto err;
        }
        f->chunks[i] = c;
        off += sizeof *c + (size_t)c->arrays * c->count * 4;
    }
    if (off != f->size - CKPT_SUM) {
        st = psagg__fail(PSAGG_EIO,
                         "[server] resume: checkpoint %s has %zu bytes after its last record", path,
                         f->size - CKPT_SUM - off);
        goto err;
    }
    return PSAGG_OK;
err:
    map_close(f);
    return st;
}

psagg_status ckpt_open(const server *srv, struct ckpt_file **out)
{
    static const char *const kept[] = {"", ".prev"};
    char path[PATH_MAX];
    struct ckpt_file *f = calloc(1, sizeof *f);
    /* with replicas every server's files, the current and the previous, else this server's */
    int n = srv->cfg.server_replicas ? srv->cfg.n_servers : 1;
    int versions = srv->cfg.server_replicas ? 2 : 1;
    uint32_t chunks = 0;
    psagg_status st = PSAGG_OK;

    *out = NULL;
    if (!f || !(f->maps = calloc((size_t)(n * versions), sizeof *f->maps))) {
        free(f);
        return psagg__fail(PSAGG_ENOMEM, "checkpoint");
    }
    for (int r = 0; r < n && !st; r++)
        for (int v = 0; v < versions && !st; v++) {
            int rank = srv->cfg.server_replicas ? r : srv->rank;
            ckpt_path(srv, rank, kept[v], path, sizeof path);
            /* with replicas a server that never wrote one (it died first) has no file, and a
               first checkpoint no previous one */
            if ((srv->cfg.server_replicas || v > 0) && access(path, F_OK) && errno == ENOENT) {
                if (rank == srv->rank && v == 0)
                    LOG_INFO(&srv->log,
                             "resume: %s does not exist (this server wrote no checkpoint): its "
                             "chunks come from the other servers' files",
                             path);
                continue;
            }
            if (!(st = ckpt_read(srv, path, rank, &f->maps[f->n_maps])))
                chunks += f->maps[f->n_maps++].head->n_chunks;
        }
    if (!st && !f->n_maps) {
        ckpt_path(srv, srv->rank, "", path, sizeof path);
        st = psagg__fail(PSAGG_EIO,
                         "[server] resume: no checkpoint in %s: neither %s nor any other "
                         "server's file (psagg-server-<rank>.ckpt) exists",
                         srv->cfg.checkpoint_dir, path);
    }
    if (st) {
        ckpt_close(f);
        return st;
    }
    if (srv->cfg.server_replicas)
        snprintf(f->path, sizeof f->path, "%s (%d files)", srv->cfg.checkpoint_dir, f->n_maps);
    else
        snprintf(f->path, sizeof f->path, "%s", f->maps[0].path);
    LOG_INFO(&srv->log,
             "resume: checkpoint %s (job '%.64s', %u tensors, %u parameter chunks) checks out; "
             "it is loaded once the workers declare the same tensors",
             f->path, f->maps[0].head->job_id, f->maps[0].head->n_tensors, chunks);
    *out = f;
    return PSAGG_OK;
}

const char *ckpt_file_path(const struct ckpt_file *f)
{
    return f->path;
}

static void decl_text(const psagg__ctl_tensor *t, char *buf, size_t len)
{
    psagg_codec c = psagg__tensor_codec(t);
    char name[40];
    snprintf(buf, len, "'%.40s' (%llu elements, %s%s)", t->name, (unsigned long long)t->count,
             psagg_codec_name(&c, name, sizeof name),
             (t->flags & PSAGG_DECL_PARAM) ? ", parameter" : "");
}

/* The job must be the one file f holds: its declaration, chunk size and optimizer. */
static psagg_status map_match(const server *srv, const ckpt_map *f, psagg__optim_kind kind)
{
    const psagg__layout *l = &srv->layout;
    const psagg__ctl_tensor *decl = srv->job_decl;

    if (f->head->n_tensors != l->n_tensors)
        return psagg__fail(
            PSAGG_EMISMATCH,
            "checkpoint %s, nothing loaded: it holds a job of %u tensors; the workers "
            "declared %u",
            f->path, f->head->n_tensors, l->n_tensors);
    for (uint32_t t = 0; t < l->n_tensors; t++)
        if (memcmp(&f->decl[t], &decl[t], sizeof decl[t])) {
            char a[120], b[120];
            decl_text(&f->decl[t], a, sizeof a);
            decl_text(&decl[t], b, sizeof b);
            return psagg__fail(
                PSAGG_EMISMATCH,
                "checkpoint %s, nothing loaded: tensor %u was %s, the workers declared "
                "%s",
                f->path, t, a, b);
        }
    if (f->head->chunk_elems != srv->job_decl_hdr.chunk_elems)
        return psagg__fail(
            PSAGG_EMISMATCH,
            "checkpoint %s, nothing loaded: its chunks have %llu elements, the workers' "
            "%llu ([worker] chunk_bytes)",
            f->path, (unsigned long long)f->head->chunk_elems,
            (unsigned long long)srv->job_decl_hdr.chunk_elems);
    if (f->head->optimizer != (uint32_t)kind)
        return psagg__fail(
            PSAGG_EMISMATCH,
            "checkpoint %s, nothing loaded: it holds the state of optimizer %s; this "
            "server runs %s",
            f->path, psagg__optim_name((psagg__optim_kind)f->head->optimizer),
            psagg__optim_name(kind));
    return PSAGG_OK;
}

/* Without replicas: the file holds exactly the parameter chunks this server owns, in slot
   order. */
static psagg_status match_owned(const server *srv, struct ckpt_file *cf, int arrays)
{
    const ckpt_map *f = &cf->maps[0];
    uint32_t k = 0;
    for (uint32_t i = 0; i < srv->n_owned; i++) {
        const chunk_state *c = &srv->chunks[i];
        const ckpt_chunk *r;
        if (!srv->layout.tensors[c->info->key].param)
            continue;
        r = k < f->head->n_chunks ? f->chunks[k] : NULL;
        if (!r || r->key != c->info->key || r->index != c->info->index ||
            r->count != c->info->count || r->arrays != (uint32_t)arrays)
            return psagg__fail(
                PSAGG_EMISMATCH,
                "checkpoint %s, nothing loaded: record %u is not tensor %u chunk %u of "
                "%llu elements with %d arrays",
                f->path, k, c->info->key, c->info->index, (unsigned long long)c->info->count,
                arrays);
        cf->by_slot[i] = r;
        k++;
    }
    if (k != f->head->n_chunks)
        return psagg__fail(
            PSAGG_EMISMATCH,
            "checkpoint %s, nothing loaded: it holds %u parameter chunks, this server "
            "owns %u",
            f->path, f->head->n_chunks, k);
    return PSAGG_OK;
}

/* The records of checkpoint `seq` in cf, by chunk of the layout (best); how many parameter chunks
   of the layout they cover. */
static uint32_t records_of(const server *srv, const struct ckpt_file *cf, uint64_t seq,
                           const ckpt_chunk **best)
{
    const psagg__layout *l = &srv->layout;
    uint32_t covered = 0;
    memset(best, 0, (l->n_chunks ? l->n_chunks : 1) * sizeof *best);
    for (int m = 0; m < cf->n_maps; m++) {
        const ckpt_map *f = &cf->maps[m];
        if (f->head->sequence != seq)
            continue;
        for (uint32_t k = 0; k < f->head->n_chunks; k++) {
            const ckpt_chunk *r = f->chunks[k];
            uint32_t g = l->tensors[r->key].first_chunk + r->index;
            covered += !best[g];
            if (!best[g])
                best[g] = r;
        }
    }
    return covered;
}

/* With replicas: each held parameter chunk (owned or copied) from the newest checkpoint
   (sequence) that holds every parameter chunk of the job in some file (its owner at that
   checkpoint wrote it; a dead server's file is older, and a commit cut short leaves the
   servers that committed a previous file of the checkpoint before). */
static psagg_status match_held(const server *srv, struct ckpt_file *cf, int arrays)
{
    const psagg__layout *l = &srv->layout;
    const ckpt_chunk **best = calloc(l->n_chunks ? l->n_chunks : 1, sizeof *best);
    uint32_t params = 0;
    uint64_t seq = 0, newest = 0, tried = UINT64_MAX;
    psagg_status st = PSAGG_OK;

    if (!best)
        return psagg__fail(PSAGG_ENOMEM, "checkpoint");
    for (uint32_t t = 0; t < l->n_tensors; t++)
        params += l->tensors[t].param ? l->tensors[t].n_chunks : 0;
    for (int m = 0; m < cf->n_maps && !st; m++) {
        const ckpt_map *f = &cf->maps[m];
        for (uint32_t k = 0; k < f->head->n_chunks && !st; k++) {
            const ckpt_chunk *r = f->chunks[k];
            const psagg__tensor_info *t = r->key < l->n_tensors ? &l->tensors[r->key] : NULL;
            uint32_t g = t ? t->first_chunk + r->index : 0;
            if (!t || !t->param || r->index >= t->n_chunks || r->count != l->chunks[g].count ||
                r->arrays != (uint32_t)arrays)
                st = psagg__fail(PSAGG_EMISMATCH,
                                 "checkpoint %s, nothing loaded: record %u (tensor %u chunk %u "
                                 "of %llu elements with %u arrays) is no parameter chunk of "
                                 "this job with %d arrays",
                                 f->path, k, r->key, r->index, (unsigned long long)r->count,
                                 r->arrays, arrays);
        }
    }
    /* the checkpoints from the newest down: the first whole one */
    while (!st && !seq) {
        uint64_t next = 0;
        for (int m = 0; m < cf->n_maps; m++)
            if (cf->maps[m].head->sequence < tried && cf->maps[m].head->sequence >= next)
                next = cf->maps[m].head->sequence;
        if (!next)
            break;
        if (!newest)
            newest = next;
        tried = next;
        if (records_of(srv, cf, next, best) == params)
            seq = next;
    }
    if (!st && !seq) { /* none whole: name a chunk the newest lacks */
        uint32_t g = 0;
        records_of(srv, cf, newest, best);
        while (g < l->n_chunks && (best[g] || !l->tensors[l->chunks[g].key].param))
            g++;
        st = psagg__fail(PSAGG_EMISMATCH,
                         "checkpoint %s, nothing loaded: no checkpoint in it holds every "
                         "parameter chunk (the newest, %llu, lacks tensor '%s' chunk %u; with "
                         "[cluster] server_replicas every server's checkpoint_dir must hold every "
                         "server's files: a shared directory, or the files copied there)",
                         cf->path, (unsigned long long)newest,
                         g < l->n_chunks ? l->tensors[l->chunks[g].key].name : "?",
                         g < l->n_chunks ? l->chunks[g].index : 0);
    }
    for (uint32_t i = 0; i < srv->n_held && !st; i++) {
        const chunk_state *c = &srv->chunks[i];
        if (l->tensors[c->info->key].param)
            cf->by_slot[i] = best[c->info - l->chunks];
    }
    if (!st && seq != newest)
        LOG_WARN(&srv->log,
                 "resume: checkpoint %llu is not whole (a commit cut short): resuming from "
                 "checkpoint %llu, the one before",
                 (unsigned long long)newest, (unsigned long long)seq);
    free(best);
    return st;
}

psagg_status ckpt_match(const server *srv, struct ckpt_file *f, psagg__optim_kind kind, int arrays)
{
    psagg_status st;
    for (int m = 0; m < f->n_maps; m++)
        if ((st = map_match(srv, &f->maps[m], kind)))
            return st;
    f->by_slot = calloc(srv->n_held ? srv->n_held : 1, sizeof *f->by_slot);
    if (!f->by_slot)
        return psagg__fail(PSAGG_ENOMEM, "checkpoint %s", f->path);
    return srv->cfg.server_replicas ? match_held(srv, f, arrays) : match_owned(srv, f, arrays);
}

const float *ckpt_state(const struct ckpt_file *f, uint32_t slot, uint32_t *arrays, uint64_t *step,
                        uint32_t *round)
{
    const ckpt_chunk *r = f && f->by_slot ? f->by_slot[slot] : NULL;
    if (!r)
        return NULL;
    *arrays = r->arrays;
    *step = r->step;
    *round = r->round;
    return (const float *)(const void *)(r + 1);
}

/* The checkpoint_dir's entries on disk (a rename durable). */
static void sync_dir(const server *srv)
{
    int dfd = open(srv->cfg.checkpoint_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

/* fwrite + the running checksum. */
typedef struct ckpt_writer {
    FILE *f;
    crypto_generichash_state hs;
    int failed;
} ckpt_writer;

static void put(ckpt_writer *wr, const void *p, size_t n)
{
    if (wr->failed || !n)
        return;
    if (fwrite(p, 1, n, wr->f) != n)
        wr->failed = errno ? errno : EIO;
    crypto_generichash_update(&wr->hs, p, n);
}

psagg_status ckpt_write(const server *srv, int arrays, const uint8_t *owned, uint64_t seq,
                        char *path, size_t len)
{
    const psagg__layout *l = &srv->layout;
    char tmp[PATH_MAX + 8];
    ckpt_writer wr = {0};
    ckpt_head head = {.version = CKPT_VERSION,
                      .server_rank = (uint32_t)srv->rank,
                      .n_servers = (uint32_t)srv->cfg.n_servers,
                      .optimizer = (uint32_t)srv->cfg.optimizer,
                      .n_tensors = l->n_tensors,
                      .chunk_elems = srv->job_decl_hdr.chunk_elems,
                      .sequence = seq};
    uint8_t sum[CKPT_SUM];
    struct timespec now;
    int fd;

    ckpt_path(srv, srv->rank, ".pending", path, len);
    if (sodium_init() < 0)
        return psagg__fail(PSAGG_EIO, "libsodium cannot start");
    /* every chunk's last round is finished, and the caller's agg_barrier made what its
       thread wrote visible here */
    memcpy(head.magic, CKPT_MAGIC, 8);
    snprintf(head.job_id, sizeof head.job_id, "%s", srv->cfg.job_id);
    clock_gettime(CLOCK_REALTIME, &now);
    head.written_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    for (uint32_t i = 0; i < srv->n_held; i++)
        head.n_chunks += srv->chunks[i].param && owned[srv->chunks[i].info - l->chunks];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || !(wr.f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return psagg__fail(PSAGG_EIO, "checkpoint %s: %s", tmp, strerror(e));
    }
    crypto_generichash_init(&wr.hs, NULL, 0, CKPT_SUM);
    put(&wr, &head, sizeof head);
    put(&wr, srv->job_decl, (size_t)l->n_tensors * sizeof(psagg__ctl_tensor));
    for (uint32_t i = 0; i < srv->n_held; i++) {
        const chunk_state *c = &srv->chunks[i];
        const param_state *ps = c->param;
        const float *arr[4];
        ckpt_chunk r;
        if (!ps || !owned[c->info - l->chunks])
            continue;
        r = (ckpt_chunk){.key = c->info->key,
                         .index = c->info->index,
                         .count = c->info->count,
                         .step = ps->step,
                         .round = c->round,
                         .arrays = (uint32_t)arrays};
        arr[0] = ps->w, arr[1] = ps->view, arr[2] = ps->m1, arr[3] = ps->m2;
        put(&wr, &r, sizeof r);
        for (uint32_t a = 0; a < r.arrays; a++)
            put(&wr, arr[a], c->info->count * sizeof(float));
    }
    crypto_generichash_final(&wr.hs, sum, sizeof sum);
    if (!wr.failed && fwrite(sum, 1, sizeof sum, wr.f) != sizeof sum)
        wr.failed = errno ? errno : EIO;
    if (!wr.failed && (fflush(wr.f) || fsync(fileno(wr.f))))
        wr.failed = errno;
    if (fclose(wr.f) && !wr.failed)
        wr.failed = errno;
    if (!wr.failed && rename(tmp, path))
        wr.failed = errno;
    if (wr.failed) {
        unlink(tmp);
        return psagg__fail(PSAGG_EIO, "checkpoint %s: %s", path, strerror(wr.failed));
    }
    sync_dir(srv); /* the rename itself durable */
    LOG_INFO(&srv->log, "checkpoint %llu prepared: %s written, %u parameter chunks",
             (unsigned long long)seq, path, head.n_chunks);
    return PSAGG_OK;
}

psagg_status ckpt_commit(const server *srv, char *path, size_t len)
{
    char pending[PATH_MAX + 16], prev[PATH_MAX + 16];
    ckpt_path(srv, srv->rank, "", path, len);
    ckpt_path(srv, srv->rank, ".pending", pending, sizeof pending);
    ckpt_path(srv, srv->rank, ".prev", prev, sizeof prev);
    /* (no current file yet: the first checkpoint) */
    if (rename(path, prev) && errno != ENOENT)
        return psagg__fail(PSAGG_EIO, "checkpoint %s: keeping it as %s: %s", path, prev,
                           strerror(errno));
    if (rename(pending, path))
        return psagg__fail(PSAGG_EIO, "checkpoint %s: putting %s in its place: %s", path, pending,
                           strerror(errno));
    sync_dir(srv); /* the renames durable */
    return PSAGG_OK;
}
