/*
 * devsim.c - the simulated device of devsim.h. One mutex guards everything; each stream's
 * thread takes a piece of work, sleeps its delay without the mutex, then runs it with the
 * mutex held (so a buffer cannot be freed in the middle of it).
 */
#include "devsim.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "kernels/codec.h"
#include "worker.h"

enum { LIB_DEV, LIB_HOST, USER };
enum {
    OP_COPY,
    OP_FILL,
    OP_ENCODE,
    OP_DECODE,
    OP_SCALE,
    OP_RECORD,
    OP_WAIT,
    OP_THC_ENCODE,
    OP_THC_DECODE
};

typedef struct range {
    char *p;
    size_t len;
    int kind, device;
    struct range *next;
} range;

typedef struct sim_event {
    long recorded, fired;
} sim_event;

typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t bytes; /* copy, fill */
    int byte;
    psagg_codec codec;
    size_t n, len;
    psagg__rng_key key, rot; /* rot: thc's rotation */
    float *residual, factor;
    const float *scales; /* thc encode */
    int decode_op;       /* thc decode */
    uint64_t *err;
    sim_event *ev;
    long ticket;
    struct op *next;
} op;

typedef struct sim_stream {
    int device, id, stop, busy;
    op *head, *tail;
    pthread_t tid;
    struct sim_stream *next;
} sim_stream;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_devices, delay_ms;
    range *live;
    sim_stream *streams;
    long tickets, enqueues, fail_enqueue, fail_alloc, hook_at;
    int fail_stream, corrupt_upload, violations, n_streams;
    void (*hook)(void *);
    void *hook_arg;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static __thread int cur_dev;

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    va_list ap;
    S.violations++;
    fprintf(stderr, "devsim: VIOLATION: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* The live allocation that holds [p, p + len), or NULL (S.mu held). */
static range *find(const void *p, size_t len)
{
    for (range *r = S.live; r; r = r->next)
        if ((const char *)p >= r->p && (const char *)p + len <= r->p + r->len)
            return r;
    return NULL;
}

static void *track(size_t bytes, int kind, int device)
{
    range *r = calloc(1, sizeof *r);
    r->p = calloc(1, bytes ? bytes : 1);
    r->len = bytes;
    r->kind = kind;
    r->device = device;
    pthread_mutex_lock(&S.mu);
    r->next = S.live;
    S.live = r;
    pthread_mutex_unlock(&S.mu);
    return r->p;
}

static void untrack(void *p)
{
    pthread_mutex_lock(&S.mu);
    for (range **pp = &S.live; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            range *r = *pp;
            *pp = r->next;
            free(r->p);
            free(r);
            pthread_mutex_unlock(&S.mu);
            return;
        }
    violation("free of %p, which is not a live allocation", p);
    pthread_mutex_unlock(&S.mu);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (ms > 0 && nanosleep(&ts, &ts))
        ;
}

/* Every buffer a piece of work touches is live when it runs (S.mu held). */
static int live(const op *o, const sim_stream *s)
{
    struct buf {
        const void *p;
        size_t len;
        const char *what;
    } b[5];
    int n = 0;
    size_t enc = o->kind == OP_SCALE || o->kind == OP_FILL || o->kind == OP_COPY ? 0 : o->len;
    size_t thc_nb = o->kind == OP_THC_ENCODE ? psagg__thc_blocks(o->n, o->codec.bucket) : 0;
    switch (o->kind) {
    case OP_COPY:
        b[n++] = (struct buf){o->dst, o->bytes, "copy destination"};
        b[n++] = (struct buf){o->src, o->bytes, "copy source"};
        break;
    case OP_FILL:
        b[n++] = (struct buf){o->dst, o->bytes, "fill destination"};
        break;
    case OP_ENCODE:
        b[n++] = (struct buf){o->src, o->n * 4, "encode input"};
        b[n++] = (struct buf){o->dst, enc, "encode output"};
        if (o->residual)
            b[n++] = (struct buf){o->residual, o->n * 4, "encode residual"};
        break;
    case OP_DECODE:
        b[n++] = (struct buf){o->src, enc, "decode input"};
        b[n++] = (struct buf){o->dst, o->n * 4, "decode output"};
        break;
    case OP_SCALE:
        b[n++] = (struct buf){o->dst, o->n * 4, "scale buffer"};
        break;
    case OP_THC_ENCODE:
        b[n++] = (struct buf){o->src, o->n * 4, "thc encode input"};
        b[n++] = (struct buf){o->dst, enc, "thc encode output"};
        b[n++] = (struct buf){o->scales, thc_nb * 4, "thc encode scales"};
        if (o->residual)
            b[n++] = (struct buf){o->residual, psagg__thc_rotated_len(o->n, o->codec.bucket) * 4,
                                  "thc encode residual"};
        break;
    case OP_THC_DECODE:
        b[n++] = (struct buf){o->src, enc, "thc decode input"};
        b[n++] = (struct buf){o->dst, o->n * 4, "thc decode output"};
        break;
    default:
        return 1;
    }
    if (o->err)
        b[n++] = (struct buf){o->err, 8, "error word"};
    for (int i = 0; i < n; i++)
        if (!find(b[i].p, b[i].len)) {
            violation("stream %d: the %s %p (%zu bytes) was freed while work on it was "
                      "queued (the work is skipped)",
                      s->id, b[i].what, b[i].p, b[i].len);
            return 0;
        }
    return 1;
}

static void err_min(uint64_t *err, psagg_status st, size_t bad)
{
    uint64_t w = ((uint64_t)bad << 8) | (uint64_t)(uint8_t)(-st);
    if (w < *err)
        *err = w;
}

/* Run one piece of work (S.mu held). */
static void run(op *o, sim_stream *s)
{
    size_t bad = 0;
    psagg_status st;
    if (!live(o, s))
        return;
    switch (o->kind) {
    case OP_COPY: {
        range *d = find(o->dst, o->bytes), *src = find(o->src, o->bytes);
        memmove(o->dst, o->src, o->bytes);
        if (S.corrupt_upload && d->kind == LIB_DEV && src->kind == LIB_HOST && o->bytes >= 4) {
            memset(o->dst, 0xFF, 4); /* a NaN: invalid meta, or a non-finite value */
            S.corrupt_upload = 0;
        }
        break;
    }
    case OP_FILL:
        memset(o->dst, o->byte, o->bytes);
        break;
    case OP_ENCODE:
        st = psagg__encode(&o->codec, o->src, o->residual, o->n, o->key, o->dst, o->len, &bad);
        if (st && o->err)
            err_min(o->err, st, bad);
        break;
    case OP_DECODE:
        st = psagg__decode_into(&o->codec, o->src, o->len, o->n, o->dst, PSAGG_DECODE_SET, 1.0f);
        if (st && o->err)
            err_min(o->err, st, 0);
        break;
    case OP_SCALE:
        for (size_t i = 0; i < o->n; i++)
            ((float *)o->dst)[i] *= o->factor;
        break;
    case OP_THC_ENCODE:
        st = psagg__thc_push_encode(o->codec.bits, o->codec.bucket, o->rot, o->scales, o->src,
                                    o->residual, o->n, o->key, o->dst, o->len, &bad);
        if (st && o->err)
            err_min(o->err, st, bad);
        break;
    case OP_THC_DECODE:
        st = psagg__thc_update_decode(o->codec.bits, o->codec.bucket, o->rot, o->src, o->len, o->n,
                                      o->factor, (psagg__decode_op)o->decode_op, o->dst, NULL);
        if (st && o->err)
            err_min(o->err, st, 0);
        break;
    case OP_RECORD:
        if (o->ev->fired < o->ticket)
            o->ev->fired = o->ticket;
        break;
    }
}

static void *stream_main(void *arg)
{
    sim_stream *s = arg;
    pthread_mutex_lock(&S.mu);
    for (;;) {
        op *o;
        while (!s->head && !s->stop)
            pthread_cond_wait(&S.cv, &S.mu);
        if (!s->head)
            break;
        o = s->head;
        s->busy = 1;
        if (o->kind == OP_WAIT) {
            while (o->ev->fired < o->ticket)
                pthread_cond_wait(&S.cv, &S.mu);
        } else if (o->kind != OP_RECORD && S.delay_ms) {
            pthread_mutex_unlock(&S.mu);
            sleep_ms(S.delay_ms);
            pthread_mutex_lock(&S.mu);
        }
        run(o, s);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = 0;
        free(o);
        pthread_cond_broadcast(&S.cv);
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

/* Count an enqueue: the hook, an injected failure, and the current device (S.mu not held). */
static psagg_status enqueue_check(const char *what, sim_stream *s)
{
    void (*hook)(void *) = NULL;
    void *arg = NULL;
    psagg_status st = PSAGG_OK;
    pthread_mutex_lock(&S.mu);
    S.enqueues++;
    if (S.hook_at && --S.hook_at == 0) {
        hook = S.hook;
        arg = S.hook_arg;
    }
    pthread_mutex_unlock(&S.mu);
    if (hook)
        hook(arg);
    pthread_mutex_lock(&S.mu);
    if (S.fail_enqueue && --S.fail_enqueue == 0)
        st = psagg__fail(PSAGG_ECUDA, "devsim: injected failure of this enqueue (%s)", what);
    else if (s && s->device != cur_dev)
        violation("%s enqueued on a stream of device %d by a thread whose current device is %d",
                  what, s->device, cur_dev);
    pthread_mutex_unlock(&S.mu);
    return st;
}

/* Device memory used on a stream of another device is a violation (S.mu not held). */
static void check_device(const void *p, sim_stream *s, const char *what)
{
    pthread_mutex_lock(&S.mu);
    range *r = find(p, 1);
    if (r && r->kind != LIB_HOST && r->device != s->device)
        violation("%s: memory of device %d used on a stream of device %d", what, r->device,
                  s->device);
    pthread_mutex_unlock(&S.mu);
}

static sim_stream *default_stream(int device);

/* A stream argument: NULL is the current device's default stream, as in CUDA. */
static sim_stream *resolve(void *stream)
{
    return stream ? stream : default_stream(cur_dev);
}

static void push(sim_stream *s, op *o)
{
    pthread_mutex_lock(&S.mu);
    if (o->kind == OP_RECORD) {
        o->ticket = ++S.tickets;
        o->ev->recorded = o->ticket;
    }
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

static op *new_op(int kind)
{
    op *o = calloc(1, sizeof *o);
    o->kind = kind;
    return o;
}

/* ---- the executor ---- */

static psagg_status x_get_device(int *dev)
{
    *dev = cur_dev;
    return PSAGG_OK;
}

static psagg_status x_set_device(int dev)
{
    if (dev < 0 || dev >= S.n_devices)
        return psagg__fail(PSAGG_EINVAL, "devsim: no device %d", dev);
    cur_dev = dev;
    return PSAGG_OK;
}

static psagg_status x_device_of(const void *p, int *dev)
{
    range *r;
    pthread_mutex_lock(&S.mu);
    r = find(p, 1);
    if (r && r->kind != LIB_HOST)
        *dev = r->device;
    pthread_mutex_unlock(&S.mu);
    if (!r || r->kind == LIB_HOST)
        return psagg__fail(PSAGG_EINVAL, "devsim: %p is not device memory", p);
    return PSAGG_OK;
}

static psagg_status alloc_check(void)
{
    psagg_status st = PSAGG_OK;
    pthread_mutex_lock(&S.mu);
    if (S.fail_alloc && --S.fail_alloc == 0)
        st = psagg__fail(PSAGG_ENOMEM, "devsim: injected allocation failure");
    pthread_mutex_unlock(&S.mu);
    return st;
}

static psagg_status x_dev_alloc(void **p, size_t bytes)
{
    psagg_status st = alloc_check();
    if (!st)
        *p = track(bytes, LIB_DEV, cur_dev);
    return st;
}

static psagg_status x_host_alloc(void **p, size_t bytes)
{
    psagg_status st = alloc_check();
    if (!st)
        *p = track(bytes, LIB_HOST, cur_dev);
    return st;
}

static void x_free(void *p)
{
    untrack(p);
}

static psagg_status x_stream_create(void **out)
{
    sim_stream *s;
    pthread_mutex_lock(&S.mu);
    if (S.fail_stream) {
        pthread_mutex_unlock(&S.mu);
        return psagg__fail(PSAGG_ECUDA, "devsim: injected failure to create a stream");
    }
    s = calloc(1, sizeof *s);
    s->device = cur_dev;
    s->id = S.n_streams++;
    s->next = S.streams;
    S.streams = s;
    pthread_mutex_unlock(&S.mu);
    pthread_create(&s->tid, NULL, stream_main, s);
    *out = s;
    return PSAGG_OK;
}

static psagg_status x_stream_sync(void *stream)
{
    sim_stream *s = stream ? stream : default_stream(cur_dev);
    pthread_mutex_lock(&S.mu);
    while (s->head)
        pthread_cond_wait(&S.cv, &S.mu);
    pthread_mutex_unlock(&S.mu);
    return PSAGG_OK;
}

static void x_stream_destroy(void *stream)
{
    sim_stream *s = stream;
    x_stream_sync(s);
    pthread_mutex_lock(&S.mu);
    s->stop = 1;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    pthread_join(s->tid, NULL);
    pthread_mutex_lock(&S.mu);
    for (sim_stream **pp = &S.streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&S.mu);
    free(s);
}

static psagg_status x_event_create(void **e)
{
    *e = calloc(1, sizeof(sim_event));
    return PSAGG_OK;
}

static void x_event_destroy(void *e)
{
    free(e);
}

static psagg_status x_event_record(void *e, void *stream)
{
    sim_stream *s = resolve(stream);
    psagg_status st = enqueue_check("event record", s);
    op *o;
    if (st)
        return st;
    o = new_op(OP_RECORD);
    o->ev = e;
    push(s, o);
    return PSAGG_OK;
}

static psagg_status x_stream_wait_event(void *stream, void *e)
{
    sim_stream *s = resolve(stream);
    psagg_status st = enqueue_check("stream wait", s);
    op *o;
    if (st)
        return st;
    o = new_op(OP_WAIT);
    o->ev = e;
    pthread_mutex_lock(&S.mu);
    o->ticket = ((sim_event *)e)->recorded;
    pthread_mutex_unlock(&S.mu);
    push(s, o);
    return PSAGG_OK;
}

static psagg_status x_event_query(void *e)
{
    sim_event *ev = e;
    psagg_status st;
    pthread_mutex_lock(&S.mu);
    st = ev->fired >= ev->recorded ? PSAGG_OK : PSAGG_BUF_PENDING;
    pthread_mutex_unlock(&S.mu);
    return st;
}

static psagg_status x_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    sim_stream *s = resolve(stream);
    psagg_status st = enqueue_check("copy", s);
    op *o;
    if (st)
        return st;
    o = new_op(OP_COPY);
    o->dst = dst;
    o->src = src;
    o->bytes = bytes;
    push(s, o);
    return PSAGG_OK;
}

static psagg_status x_fill(void *dst, int byte, size_t bytes, void *stream)
{
    sim_stream *s = resolve(stream);
    psagg_status st = enqueue_check("fill", s);
    op *o;
    if (st)
        return st;
    check_device(dst, s, "fill");
    o = new_op(OP_FILL);
    o->dst = dst;
    o->byte = byte;
    o->bytes = bytes;
    push(s, o);
    return PSAGG_OK;
}

/* The CUDA codecs' argument checks (codec_cuda.h): on the host, nothing enqueued. */
static psagg_status codec_args(const psagg_codec *c, size_t n, size_t len, const void *f,
                               const void *enc, const char *what)
{
    psagg_codec copy = *c;
    psagg_status st;
    if ((st = psagg__codec_check(&copy)))
        return st;
    if (len != psagg__encoded_size(c, n))
        return psagg__fail(PSAGG_EBADLEN, "devsim %s: %zu bytes, codec needs %zu", what, len,
                           psagg__encoded_size(c, n));
    if (((uintptr_t)f & 3) || ((uintptr_t)enc & 7))
        return psagg__fail(PSAGG_EINVAL, "devsim %s: misaligned buffer", what);
    return PSAGG_OK;
}

/* An encode (kind OP_ENCODE) or a thc push (OP_THC_ENCODE: rot and scales too). */
static psagg_status encode_op(int kind, const char *what, const psagg_codec *codec,
                              psagg__rng_key rot, const float *scales, const float *x,
                              float *residual, size_t n, psagg__rng_key key, void *out,
                              size_t out_len, uint64_t *d_err, void *stream)
{
    sim_stream *s = resolve(stream);
    psagg_status st = codec_args(codec, n, out_len, x, out, what);
    op *o;
    if (st || (st = enqueue_check(what, s)))
        return st;
    check_device(x, s, kind == OP_ENCODE ? "encode input" : "thc encode input");
    o = new_op(kind);
    o->codec = *codec;
    o->rot = rot;
    o->scales = scales;
    o->src = x;
    o->residual = residual;
    o->n = n;
    o->key = key;
    o->dst = out;
    o->len = out_len;
    o->err = d_err;
    push(s, o);
    return PSAGG_OK;
}

static psagg_status x_encode(const psagg_codec *codec, const float *x, float *residual, size_t n,
                             psagg__rng_key key, void *out, size_t out_len, uint64_t *d_err,
                             void *stream)
{
    return encode_op(OP_ENCODE, "encode", codec, key, NULL, x, residual, n, key, out, out_len,
                     d_err, stream);
}

static psagg_status x_decode(const psagg_codec *codec, const void *in, size_t in_len, size_t n,
                             float *out, uint64_t *d_err, void *stream)
{
    sim_stream *s = resolve(stream);
    psagg_status st = codec_args(codec, n, in_len, out, in, "decode");
    op *o;
    if (st || (st = enqueue_check("decode", s)))
        return st;
    check_device(out, s, "decode output");
    o = new_op(OP_DECODE);
    o->codec = *codec;
    o->src = in;
    o->len = in_len;
    o->n = n;
    o->dst = out;
    o->err = d_err;
    push(s, o);
    return PSAGG_OK;
}

static psagg_status x_scale(float *x, size_t n, float f, void *stream)
{
    sim_stream *s = resolve(stream);
    psagg_status st = enqueue_check("scale", s);
    op *o;
    if (st)
        return st;
    o = new_op(OP_SCALE);
    o->dst = x;
    o->n = n;
    o->factor = f;
    push(s, o);
    return PSAGG_OK;
}

static psagg_status x_thc_encode(const psagg_codec *codec, psagg__rng_key rot, const float *scales,
                                 const float *x, float *residual, size_t n, psagg__rng_key key,
                                 void *out, size_t out_len, uint64_t *d_err, void *stream)
{
    return encode_op(OP_THC_ENCODE, "thc encode", codec, rot, scales, x, residual, n, key, out,
                     out_len, d_err, stream);
}

static psagg_status x_thc_decode(const psagg_codec *codec, psagg__rng_key rot, const void *in,
                                 size_t in_len, size_t n, float factor, psagg__decode_op dop,
                                 float *out, uint64_t *d_err, void *stream)
{
    sim_stream *s = resolve(stream);
    psagg_status st = enqueue_check("thc decode", s);
    op *o;
    if (st)
        return st;
    if (!psagg__thc_update_bytes(codec->bits, codec->bucket, n, 1) || ((uintptr_t)in & 7) ||
        ((uintptr_t)out & 3))
        return psagg__fail(PSAGG_EINVAL, "devsim thc decode: codec or alignment");
    check_device(out, s, "thc decode output");
    o = new_op(OP_THC_DECODE);
    o->codec = *codec;
    o->rot = rot;
    o->src = in;
    o->len = in_len;
    o->n = n;
    o->factor = factor;
    o->decode_op = (int)dop;
    o->dst = out;
    o->err = d_err;
    push(s, o);
    return PSAGG_OK;
}

static psagg_status x_err_status(uint64_t w, size_t *bad)
{
    psagg_status st;
    if (w == UINT64_MAX)
        return PSAGG_OK;
    st = -(psagg_status)(w & 0xFF);
    *bad = (size_t)(w >> 8);
    return psagg__fail(st, "devsim codec: index %zu: %s", *bad, psagg_strerror(st));
}

static const psagg__devexec devsim = {
    .name = "devsim",
    .get_device = x_get_device,
    .set_device = x_set_device,
    .device_of = x_device_of,
    .dev_alloc = x_dev_alloc,
    .host_alloc = x_host_alloc,
    .dev_free = x_free,
    .host_free = x_free,
    .stream_create = x_stream_create,
    .stream_destroy = x_stream_destroy,
    .stream_sync = x_stream_sync,
    .event_create = x_event_create,
    .event_destroy = x_event_destroy,
    .event_record = x_event_record,
    .stream_wait_event = x_stream_wait_event,
    .event_query = x_event_query,
    .copy = x_copy,
    .fill = x_fill,
    .encode = x_encode,
    .decode = x_decode,
    .scale = x_scale,
    .thc_encode = x_thc_encode,
    .thc_decode = x_thc_decode,
    .err_status = x_err_status,
};

/* ---- the test's side ---- */

static sim_stream *user_streams[8];

static sim_stream *default_stream(int device)
{
    return devsim_user_stream(device);
}

void devsim_init(int n_devices, int delay_ms)
{
    S.n_devices = n_devices;
    S.delay_ms = delay_ms;
}

const psagg__devexec *devsim_exec(void)
{
    return &devsim;
}

void devsim_set_delay(int delay_ms)
{
    pthread_mutex_lock(&S.mu);
    S.delay_ms = delay_ms;
    pthread_mutex_unlock(&S.mu);
}

void *devsim_user_alloc(int device, size_t bytes)
{
    return track(bytes, USER, device);
}

void devsim_user_free(void *p)
{
    untrack(p);
}

void *devsim_user_stream(int device)
{
    if (!user_streams[device]) {
        int saved = cur_dev;
        void *s = NULL;
        cur_dev = device;
        if (x_stream_create(&s) == PSAGG_OK)
            user_streams[device] = s;
        cur_dev = saved;
    }
    return user_streams[device];
}

void devsim_fail_enqueue(long nth)
{
    pthread_mutex_lock(&S.mu);
    S.fail_enqueue = nth;
    pthread_mutex_unlock(&S.mu);
}

void devsim_fail_alloc(long nth)
{
    pthread_mutex_lock(&S.mu);
    S.fail_alloc = nth;
    pthread_mutex_unlock(&S.mu);
}

void devsim_fail_stream_create(int on)
{
    pthread_mutex_lock(&S.mu);
    S.fail_stream = on;
    pthread_mutex_unlock(&S.mu);
}

void devsim_on_enqueue(long nth, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&S.mu);
    S.hook_at = nth;
    S.hook = fn;
    S.hook_arg = arg;
    pthread_mutex_unlock(&S.mu);
}

void devsim_corrupt_next_upload(void)
{
    pthread_mutex_lock(&S.mu);
    S.corrupt_upload = 1;
    pthread_mutex_unlock(&S.mu);
}

long devsim_enqueues(void)
{
    long n;
    pthread_mutex_lock(&S.mu);
    n = S.enqueues;
    pthread_mutex_unlock(&S.mu);
    return n;
}

long devsim_lib_allocs(void)
{
    long n = 0;
    pthread_mutex_lock(&S.mu);
    for (range *r = S.live; r; r = r->next)
        n += r->kind != USER;
    pthread_mutex_unlock(&S.mu);
    return n;
}

size_t devsim_lib_bytes(void)
{
    size_t n = 0;
    pthread_mutex_lock(&S.mu);
    for (range *r = S.live; r; r = r->next)
        n += r->kind != USER ? r->len : 0;
    pthread_mutex_unlock(&S.mu);
    return n;
}

void devsim_quiesce(void)
{
    pthread_mutex_lock(&S.mu);
    for (;;) {
        int busy = 0;
        for (sim_stream *s = S.streams; s; s = s->next)
            busy |= s->head != NULL;
        if (!busy)
            break;
        pthread_cond_wait(&S.cv, &S.mu);
    }
    pthread_mutex_unlock(&S.mu);
}

int devsim_violations(void)
{
    int n;
    pthread_mutex_lock(&S.mu);
    n = S.violations;
    pthread_mutex_unlock(&S.mu);
    return n;
}
