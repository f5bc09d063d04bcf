/*
 * train_digits.c - psagg-train-digits: data-parallel training of a small MLP on the
 * 8x8 digits data set (1797 images, 10 classes; Debian's python3-sklearn ships it), with
 * libpsagg aggregating the gradients, as a training loop would use it.
 *
 * Run it through the launcher, one process per worker:
 *   deploy/psagg-local --config conf/local.ini -- build/worker/examples/psagg-train-digits
 *
 * Model: 64 inputs (pixels / 16) -> 64 hidden (ReLU) -> 10 (softmax), cross-entropy loss.
 * Every worker initialises the weights from the same seed, splits the data set the same way
 * (a seeded shuffle; the last 20% is the test set), and trains on its own rank-strided shard
 * of the training set: each step it runs forward/backward on a local mini-batch, averages
 * the four gradient tensors over all workers with psagg_push_pull(PSAGG_AVERAGE), and applies
 * the average with SGD + momentum (learning rate with a cosine decay unless --schedule
 * constant). The servers send every worker the same bytes, so every worker applies
 * bit-identical updates and the models stay identical: each worker prints "MODEL-HASH <hex>"
 * of its final weights, and they must all be equal.
 *
 * --server-optimizer: the four weight tensors are declared as parameters and the servers run
 * the optimizer (start them with [server] optimizer = sgd and momentum = --momentum, e.g.
 * PSAGG_SERVER_OPTIMIZER=sgd PSAGG_SERVER_MOMENTUM=0.9): psagg_param_init hands every worker
 * worker 0's initial weights, each step sends the step's learning rate (psagg_set_lr) with
 * the gradients, and the weights come back updated; this process keeps no velocity.
 *
 * --diloco H: DiLoCo, the outer optimizer on the servers (start them with [server] optimizer
 * = sgd, momentum = 0.9, nesterov = on). The weight tensors are declared as parameters, and
 * psagg_param_init fills this process's anchors (its copy of the global weights) with worker
 * 0's. Each step is a local SGD + momentum step on the local gradient, no communication;
 * every H steps the pseudo-gradient anchor - weights goes to the servers as the parameter's
 * gradient (psagg_set_lr: --outer-lr; PSAGG_AVERAGE), the anchors take the servers' delta
 * and the weights become the anchors. All a C loop needs for DiLoCo is in psagg.h already.
 *
 * The codec comes from the config ([codec] default, min_compress_elems); every gradient
 * tensor is declared with PSAGG_CODEC_DEFAULT. Run it with PSAGG_CODEC_DEFAULT=fp32 for the
 * uncompressed baseline (deploy/demo.sh runs both).
 *
 * Output: rank 0 prints one line per epoch (mean training loss over all workers, test
 * accuracy, time per step, bytes sent per step, compression ratio) and a final
 * "RESULT key=value ..." line; every worker prints "MODEL-HASH <hex>" (of the anchors with
 * --diloco).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "psagg.h"

enum { N_IN = 64, N_HID = 64, N_OUT = 10, N_ROWS_MAX = 4096 };

#define DIGITS_PATH "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

/* The parameters (or gradients, or momenta) of the MLP, one array per tensor. */
typedef struct params {
    float w1[N_HID * N_IN]; /* [hidden][input] */
    float b1[N_HID];
    float w2[N_OUT * N_HID]; /* [output][hidden] */
    float b2[N_OUT];
} params;

enum { T_W1, T_B1, T_W2, T_B2, N_PARAM_TENSORS, T_METRICS = N_PARAM_TENSORS, N_TENSORS };

typedef struct dataset {
    int n;
    float (*x)[N_IN];
    int *y;
} dataset;

/* splitmix64: a small, fast generator; the same seed gives the same stream everywhere. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a), computed in float from 24 random bits: identical on every worker. */
static float rng_uniform(uint64_t *s, float a)
{
    return ((float)(rng_next(s) >> 40) * 0x1p-24f * 2.0f - 1.0f) * a;
}

static void shuffle(int *v, int n, uint64_t seed)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_next(&seed) % (uint64_t)(i + 1));
        int t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/*
 * Find digits.csv.gz when --data is not given: the usual Debian path, else whatever
 * `dpkg -L python3-sklearn` lists. Returns a malloc'd path or NULL.
 */
static char *find_digits(void)
{
    char line[4096];
    char *found = NULL;
    FILE *p;

    if (access(DIGITS_PATH, R_OK) == 0)
        return strdup(DIGITS_PATH);
    p = popen("dpkg -L python3-sklearn 2>/dev/null", "r");
    if (!p)
        return NULL;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        size_t n = strlen(line), m = strlen("/datasets/data/digits.csv.gz");
        if (!found && n >= m && !strcmp(line + n - m, "/datasets/data/digits.csv.gz"))
            found = strdup(line);
    }
    pclose(p);
    return found;
}

/*
 * Read the digits CSV (gzip): each line holds 64 pixel values 0..16 and the label 0..9.
 * Pixels are scaled to [0, 1]. Returns 0, or -1 with a message on stderr.
 */
static int load_digits(const char *path, dataset *d)
{
    char line[4096];
    gzFile f = gzopen(path, "rb");
    int lineno = 0;

    if (!f) {
        fprintf(stderr, "train-digits: cannot open %s: %s\n", path,
                errno ? strerror(errno) : "zlib error");
        return -1;
    }
    d->n = 0;
    d->x = malloc(N_ROWS_MAX * sizeof *d->x);
    d->y = malloc(N_ROWS_MAX * sizeof *d->y);
    if (!d->x || !d->y) {
        gzclose(f);
        fprintf(stderr, "train-digits: out of memory\n");
        return -1;
    }
    while (gzgets(f, line, sizeof line)) {
        char *p = line, *end;
        float v[N_IN + 1];
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0')
            continue;
        for (int i = 0; i <= N_IN; i++) {
            errno = 0;
            v[i] = strtof(p, &end);
            if (end == p || errno || !(v[i] >= 0.0f && v[i] <= (i < N_IN ? 16.0f : 9.0f)) ||
                (i < N_IN && *end != ',') || (i == N_IN && end[strspn(end, " \t\r\n")] != '\0')) {
                fprintf(stderr, "train-digits: %s:%d: field %d is not a valid %s\n", path, lineno,
                        i + 1, i < N_IN ? "pixel (0..16)" : "label (0..9)");
                gzclose(f);
                return -1;
            }
            p = end + 1;
        }
        if (d->n == N_ROWS_MAX) {
            fprintf(stderr, "train-digits: %s: more than %d rows\n", path, N_ROWS_MAX);
            gzclose(f);
            return -1;
        }
        for (int i = 0; i < N_IN; i++)
            d->x[d->n][i] = v[i] / 16.0f;
        d->y[d->n] = (int)v[N_IN];
        if ((float)d->y[d->n] != v[N_IN]) {
            fprintf(stderr, "train-digits: %s:%d: label %g is not an integer\n", path, lineno,
                    (double)v[N_IN]);
            gzclose(f);
            return -1;
        }
        d->n++;
    }
    if (!gzeof(f)) {
        int zerr;
        fprintf(stderr, "train-digits: %s: read error: %s\n", path, gzerror(f, &zerr));
        gzclose(f);
        return -1;
    }
    gzclose(f);
    if (d->n < 100) {
        fprintf(stderr, "train-digits: %s: only %d rows\n", path, d->n);
        return -1;
    }
    return 0;
}

/* Forward pass of one sample: hidden activations h and class probabilities p. */
static void forward(const params *m, const float *x, float *h, float *p)
{
    float zmax;
    float sum = 0.0f;

    for (int j = 0; j < N_HID; j++) {
        float a = m->b1[j];
        const float *w = &m->w1[j * N_IN];
        for (int i = 0; i < N_IN; i++)
            a += w[i] * x[i];
        h[j] = a > 0.0f ? a : 0.0f;
    }
    for (int k = 0; k < N_OUT; k++) {
        float a = m->b2[k];
        const float *w = &m->w2[k * N_HID];
        for (int j = 0; j < N_HID; j++)
            a += w[j] * h[j];
        p[k] = a;
    }
    zmax = p[0];
    for (int k = 1; k < N_OUT; k++)
        if (p[k] > zmax)
            zmax = p[k];
    for (int k = 0; k < N_OUT; k++) {
        p[k] = expf(p[k] - zmax);
        sum += p[k];
    }
    for (int k = 0; k < N_OUT; k++)
        p[k] /= sum;
}

/*
 * Output-layer half of the backward pass for one sample, accumulated into g (scaled by
 * 1/batch): dz = (p - onehot(y)) / batch. Writes dz for the hidden-layer half; returns the
 * sample's cross-entropy loss.
 */
static float backward_out(const float *h, const float *p, int y, float inv_b, params *g, float *dz)
{
    for (int k = 0; k < N_OUT; k++) {
        dz[k] = (p[k] - (k == y ? 1.0f : 0.0f)) * inv_b;
        g->b2[k] += dz[k];
        float *gw = &g->w2[k * N_HID];
        for (int j = 0; j < N_HID; j++)
            gw[j] += dz[k] * h[j];
    }
    return -logf(p[y] > 1e-30f ? p[y] : 1e-30f);
}

/* Hidden-layer half of the backward pass for one sample (needs the same W2 as forward). */
static void backward_hidden(const params *m, const float *x, const float *h, const float *dz,
                            params *g)
{
    for (int j = 0; j < N_HID; j++) {
        float dh = 0.0f;
        if (h[j] <= 0.0f)
            continue;
        for (int k = 0; k < N_OUT; k++)
            dh += m->w2[k * N_HID + j] * dz[k];
        g->b1[j] += dh;
        float *gw = &g->w1[j * N_IN];
        for (int i = 0; i < N_IN; i++)
            gw[i] += dh * x[i];
    }
}

static double accuracy(const params *m, const dataset *d, const int *idx, int n)
{
    float h[N_HID], p[N_OUT];
    int correct = 0;
    for (int s = 0; s < n; s++) {
        int best = 0;
        forward(m, d->x[idx[s]], h, p);
        for (int k = 1; k < N_OUT; k++)
            if (p[k] > p[best])
                best = k;
        correct += best == d->y[idx[s]];
    }
    return n ? (double)correct / n : 0.0;
}

static int psagg__failed(const char *what, int st)
{
    fprintf(stderr, "train-digits: %s: %s: %s\n", what, psagg_strerror(st), psagg_last_error());
    return 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: psagg-train-digits [--data PATH] [--config INI] [--epochs N] [--lr X]\n"
               "                          [--momentum X] [--batch B] [--seed S]\n"
               "                          [--schedule cosine|constant] [--server-optimizer]\n"
               "                          [--diloco H [--outer-lr X]]\n"
               "Run one process per worker through deploy/psagg-local (it sets PSAGG_RANK,\n"
               "PSAGG_WORLD_SIZE and PSAGG_CONFIG).\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"data", required_argument, NULL, 'd'},
                                         {"config", required_argument, NULL, 'c'},
                                         {"epochs", required_argument, NULL, 'e'},
                                         {"lr", required_argument, NULL, 'l'},
                                         {"momentum", required_argument, NULL, 'm'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"schedule", required_argument, NULL, 'S'},
                                         {"server-optimizer", no_argument, NULL, 'O'},
                                         {"diloco", required_argument, NULL, 'D'},
                                         {"outer-lr", required_argument, NULL, 'L'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *config = NULL;
    char *data_path = NULL;
    int epochs = 20, batch = 32, c, st, rank, world, cosine = 1, server_opt = 0, diloco = 0;
    float outer_lr = 0.7f;
    float lr = 0.2f, momentum = 0.9f;
    uint64_t seed = 42;
    dataset d;
    psagg_ctx *ctx = NULL;
    static params model, grad, velocity, anchor;
    float *const param_ptr[N_PARAM_TENSORS] = {model.w1, model.b1, model.w2, model.b2};
    float *const grad_ptr[N_PARAM_TENSORS] = {grad.w1, grad.b1, grad.w2, grad.b2};
    float *const vel_ptr[N_PARAM_TENSORS] = {velocity.w1, velocity.b1, velocity.w2, velocity.b2};
    float *const anchor_ptr[N_PARAM_TENSORS] = {anchor.w1, anchor.b1, anchor.w2, anchor.b2};
    static const uint64_t counts[N_TENSORS] = {N_HID * N_IN, N_HID, N_OUT * N_HID, N_OUT, 2};
    static const char *const names[N_TENSORS] = {"W1", "b1", "W2", "b2", "metrics"};
    psagg_tensor_desc desc[N_TENSORS];
    int *order, *shard, n_train, n_test, shard_n, min_shard, steps_per_epoch;
    double t_train = 0, t_wait = 0, final_acc = 0, final_loss = 0;
    uint64_t metric_bytes = 0, metric_raw = 0;
    long total_steps = 0;
    psagg_stats s0 = {.struct_size = sizeof s0}, s_prev;
    uint64_t hash;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'd':
            data_path = strdup(optarg);
            break;
        case 'c':
            config = optarg;
            break;
        case 'e':
            epochs = (int)strtol(optarg, &end, 10);
            break;
        case 'l':
            lr = strtof(optarg, &end);
            break;
        case 'm':
            momentum = strtof(optarg, &end);
            break;
        case 'b':
            batch = (int)strtol(optarg, &end, 10);
            break;
        case 's':
            seed = strtoull(optarg, &end, 0);
            break;
        case 'S':
            if (strcmp(optarg, "cosine") && strcmp(optarg, "constant")) {
                fprintf(stderr, "train-digits: --schedule is cosine or constant\n");
                return 2;
            }
            cosine = !strcmp(optarg, "cosine");
            break;
        case 'D':
            diloco = atoi(optarg);
            server_opt = diloco > 0; /* the weights are parameters; the servers step them */
            if (diloco < 1) {
                fprintf(stderr, "train-digits: --diloco needs H >= 1\n");
                return 2;
            }
            break;
        case 'L':
            outer_lr = strtof(optarg, NULL);
            if (!(outer_lr >= 0.0f && outer_lr <= 1e6f)) {
                fprintf(stderr, "train-digits: --outer-lr must be in 0..1e6\n");
                return 2;
            }
            break;
        case 'O':
            server_opt = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (end && (*end || end == optarg)) {
            fprintf(stderr, "train-digits: bad number '%s'\n", optarg);
            return 2;
        }
    }
    if (optind < argc || epochs < 1 || batch < 1 || !(lr > 0.0f) ||
        !(momentum >= 0.0f && momentum < 1.0f)) {
        fprintf(stderr, "train-digits: need --epochs >= 1, --batch >= 1, --lr > 0, "
                        "0 <= --momentum < 1 and no extra arguments\n");
        usage(stderr);
        return 2;
    }
    if (!data_path && !(data_path = find_digits())) {
        fprintf(stderr, "train-digits: digits.csv.gz not found (install python3-sklearn or "
                        "give --data PATH)\n");
        return 1;
    }
    if (load_digits(data_path, &d))
        return 1;

    /* The same split on every worker: a seeded shuffle, the last 20% is the test set. */
    order = malloc((size_t)d.n * sizeof *order);
    shard = malloc((size_t)d.n * sizeof *shard);
    if (!order || !shard) {
        fprintf(stderr, "train-digits: out of memory\n");
        return 1;
    }
    for (int i = 0; i < d.n; i++)
        order[i] = i;
    shuffle(order, d.n, seed);
    n_test = d.n / 5;
    n_train = d.n - n_test;

    if ((st = psagg_init(config, -1, -1, &ctx)))
        return psagg__failed("psagg_init", st);
    rank = psagg_rank(ctx);
    world = psagg_world_size(ctx);
    if (n_train < world) {
        fprintf(stderr, "train-digits: %d training samples for %d workers\n", n_train, world);
        psagg_close(ctx);
        return 1;
    }

    /*
     * This worker's shard: training positions rank, rank + W, ... Every worker takes the
     * same number of steps with the same batch sizes (from the smallest shard), so each
     * averaged gradient is the mean over W equal batches: the same as one process
     * training with batch W*B. The shard is reshuffled each epoch; a worker whose shard is
     * one sample larger skips a different sample each epoch.
     */
    shard_n = 0;
    for (int i = rank; i < n_train; i += world)
        shard[shard_n++] = order[i];
    min_shard = n_train / world;
    if (batch > min_shard)
        batch = min_shard;
    steps_per_epoch = (min_shard + batch - 1) / batch;

    /* W1, b1, W2, b2 with the config's codec; metrics (loss sum, samples) exact in fp32. */
    for (int t = 0; t < N_TENSORS; t++)
        desc[t] = (psagg_tensor_desc){
            .struct_size = sizeof(psagg_tensor_desc),
            .name = names[t],
            .count = counts[t],
            .codec = {.id = PSAGG_CODEC_DEFAULT},
            .error_feedback = -1,
            .flags = server_opt && t < N_PARAM_TENSORS ? PSAGG_TENSOR_PARAMETER : 0};
    desc[T_METRICS].codec = (psagg_codec){.id = PSAGG_CODEC_FP32};
    desc[T_METRICS].error_feedback = 0;
    if ((st = psagg_declare(ctx, desc, N_TENSORS, NULL)))
        return psagg__failed("psagg_declare", st);

    /* Identical initial weights everywhere: He-uniform W1, Glorot-uniform W2, zero biases. */
    {
        uint64_t s = seed ^ 0x5EEDF00Dull;
        float a1 = sqrtf(6.0f / N_IN), a2 = sqrtf(6.0f / (N_HID + N_OUT));
        for (int i = 0; i < N_HID * N_IN; i++)
            model.w1[i] = rng_uniform(&s, a1);
        for (int i = 0; i < N_OUT * N_HID; i++)
            model.w2[i] = rng_uniform(&s, a2);
    }
    for (int t = 0; server_opt && t < N_PARAM_TENSORS; t++) { /* the servers take worker 0's */
        psagg_handle *ih;
        float *w = diloco ? anchor_ptr[t] : param_ptr[t];
        if (diloco)
            memcpy(w, param_ptr[t], counts[t] * sizeof(float));
        if ((st = psagg_param_init(ctx, (uint32_t)t, w, &ih)) || (st = psagg_wait(ih, -1)))
            return psagg__failed("psagg_param_init", st);
        psagg_release(ih);
        if (diloco) /* start from the global weights */
            memcpy(param_ptr[t], w, counts[t] * sizeof(float));
    }

    if (rank == 0) {
        printf("train-digits: %d samples (%d train, %d test), %d workers, shard ~%d, batch %d "
               "per worker (%d global), %d steps/epoch, lr %g (%s), momentum %g, %d epochs\n",
               d.n, n_train, n_test, world, min_shard, batch, batch * world, steps_per_epoch,
               (double)lr, cosine ? "cosine decay" : "constant", (double)momentum, epochs);
        fflush(stdout);
    }
    if ((st = psagg_get_stats(ctx, &s0)))
        return psagg__failed("psagg_get_stats", st);
    s_prev = s0;

    for (int epoch = 1; epoch <= epochs; epoch++) {
        double t_epoch = 0, w_epoch = 0, loss_sum = 0;
        float metrics[2];
        psagg_handle *mh;
        psagg_stats s_now = {.struct_size = sizeof s_now},
                    s_before_metrics = {.struct_size = sizeof s_before_metrics};

        shuffle(shard, shard_n, seed ^ ((uint64_t)epoch << 32) ^ (uint64_t)(rank + 1) << 16);
        for (int step = 0; step < steps_per_epoch; step++) {
            int first = step * batch;
            int bsz = first + batch <= min_shard ? batch : min_shard - first;
            float inv_b = 1.0f / (float)bsz;
            static float h[N_ROWS_MAX][N_HID], dz[N_ROWS_MAX][N_OUT];
            float p[N_OUT];
            psagg_handle *hd[N_PARAM_TENSORS];
            double t0 = now_s(), tw;
            /* the same learning rate on every worker: a function of the global step only */
            float lr_t = cosine ? (float)(0.5 * lr *
                                          (1.0 + cos(M_PI * (double)(total_steps + step) /
                                                     ((double)epochs * steps_per_epoch))))
                                : lr;

            if (server_opt && !diloco && (st = psagg_set_lr(ctx, PSAGG_ALL_KEYS, lr_t, 0.0f)))
                return psagg__failed("psagg_set_lr", st);
            memset(&grad, 0, sizeof grad);
            for (int s = 0; s < bsz; s++) {
                int i = shard[first + s];
                forward(&model, d.x[i], h[s], p);
                loss_sum += backward_out(h[s], p, d.y[i], inv_b, &grad, dz[s]);
            }
            /* The output layer's gradients are complete: start their aggregation now and
             * compute the hidden layer's while they travel. W1 gets the higher priority:
             * the next forward pass needs it first. */
            /* (with --server-optimizer the updates write the weights, and backward_hidden
             * still reads W2: then every push starts after it) */
            if (diloco) { /* an inner step: local SGD + momentum, no communication */
                for (int s = 0; s < bsz; s++)
                    backward_hidden(&model, d.x[shard[first + s]], h[s], dz[s], &grad);
                for (int t = 0; t < N_PARAM_TENSORS; t++)
                    for (uint64_t i = 0; i < counts[t]; i++) {
                        vel_ptr[t][i] = momentum * vel_ptr[t][i] + grad_ptr[t][i];
                        param_ptr[t][i] -= lr_t * vel_ptr[t][i];
                    }
                if ((total_steps + step + 1) % diloco == 0) { /* the outer step */
                    tw = now_s();
                    if ((st = psagg_set_lr(ctx, PSAGG_ALL_KEYS, outer_lr, 0.0f)))
                        return psagg__failed("psagg_set_lr", st);
                    for (int t = 0; t < N_PARAM_TENSORS; t++) {
                        for (uint64_t i = 0; i < counts[t]; i++) /* the pseudo-gradient */
                            grad_ptr[t][i] = anchor_ptr[t][i] - param_ptr[t][i];
                        if ((st = psagg_push_pull(ctx, (uint32_t)t, grad_ptr[t], anchor_ptr[t],
                                                  PSAGG_AVERAGE, 0, &hd[t])))
                            return psagg__failed("psagg_push_pull", st);
                    }
                    for (int t = 0; t < N_PARAM_TENSORS; t++) {
                        st = psagg_wait(hd[t], -1);
                        psagg_release(hd[t]);
                        if (st)
                            return psagg__failed("psagg_wait", st);
                        memcpy(param_ptr[t], anchor_ptr[t], counts[t] * sizeof(float));
                    }
                    w_epoch += now_s() - tw;
                }
                t_epoch += now_s() - t0;
                continue;
            }
            if (!server_opt &&
                ((st = psagg_push_pull(ctx, T_W2, grad.w2, grad.w2, PSAGG_AVERAGE, 0, &hd[T_W2])) ||
                 (st = psagg_push_pull(ctx, T_B2, grad.b2, grad.b2, PSAGG_AVERAGE, 0, &hd[T_B2]))))
                return psagg__failed("psagg_push_pull", st);
            for (int s = 0; s < bsz; s++)
                backward_hidden(&model, d.x[shard[first + s]], h[s], dz[s], &grad);
            for (int t = 0; t < N_PARAM_TENSORS; t++) {
                int out_layer = t == T_W2 || t == T_B2;
                if (!server_opt && out_layer)
                    continue; /* started above */
                if ((st = psagg_push_pull(ctx, (uint32_t)t, grad_ptr[t],
                                          server_opt ? param_ptr[t] : grad_ptr[t], PSAGG_AVERAGE,
                                          out_layer ? 0 : 1, &hd[t])))
                    return psagg__failed("psagg_push_pull", st);
            }
            tw = now_s();
            for (int t = 0; t < N_PARAM_TENSORS; t++) {
                st = psagg_wait(hd[t], -1);
                psagg_release(hd[t]);
                if (st)
                    return psagg__failed("psagg_wait", st);
            }
            w_epoch += now_s() - tw;
            /* SGD with momentum on the averaged gradient: bit-identical on every worker. */
            for (int t = 0; t < N_PARAM_TENSORS && !server_opt; t++)
                for (uint64_t i = 0; i < counts[t]; i++) {
                    vel_ptr[t][i] = momentum * vel_ptr[t][i] + grad_ptr[t][i];
                    param_ptr[t][i] -= lr_t * vel_ptr[t][i];
                }
            t_epoch += now_s() - t0;
        }
        total_steps += steps_per_epoch;
        t_train += t_epoch;
        t_wait += w_epoch;

        /* Mean training loss over all workers' samples of this epoch (exact, fp32). */
        psagg_get_stats(ctx, &s_before_metrics);
        metrics[0] = (float)loss_sum;
        metrics[1] = (float)min_shard;
        if ((st = psagg_push_pull(ctx, T_METRICS, metrics, metrics, PSAGG_SUM, 0, &mh)))
            return psagg__failed("psagg_push_pull(metrics)", st);
        st = psagg_wait(mh, -1);
        psagg_release(mh);
        if (st)
            return psagg__failed("psagg_wait(metrics)", st);
        psagg_get_stats(ctx, &s_now);
        metric_bytes += s_now.bytes_sent - s_before_metrics.bytes_sent;
        metric_raw += s_now.bytes_raw - s_before_metrics.bytes_raw;

        final_loss = metrics[0] / metrics[1];
        final_acc = accuracy(&model, &d, order + n_train, n_test);
        if (rank == 0) {
            uint64_t sent = s_before_metrics.bytes_sent - s_prev.bytes_sent;
            uint64_t raw = s_before_metrics.bytes_raw - s_prev.bytes_raw;
            printf("epoch %3d/%d  loss %.4f  test-acc %.4f  step %.3f ms (waiting %.3f ms)  "
                   "sent %.0f B/step  compression %.2fx\n",
                   epoch, epochs, final_loss, final_acc, 1e3 * t_epoch / steps_per_epoch,
                   1e3 * w_epoch / steps_per_epoch, (double)sent / steps_per_epoch,
                   sent ? (double)raw / (double)sent : 0.0);
            fflush(stdout);
        }
        s_prev = s_now;
    }

    hash = 0xCBF29CE484222325ull; /* DiLoCo: the global weights (the anchors) */
    for (int t = 0; t < N_PARAM_TENSORS; t++)
        hash = fnv1a(hash, diloco ? anchor_ptr[t] : param_ptr[t], counts[t] * sizeof(float));
    if (rank == 0) {
        psagg_stats s_end = {.struct_size = sizeof s_end};
        uint64_t sent, raw;
        psagg_get_stats(ctx, &s_end);
        sent = s_end.bytes_sent - s0.bytes_sent - metric_bytes;
        raw = s_end.bytes_raw - s0.bytes_raw - metric_raw;
        printf("RESULT workers=%d epochs=%d steps=%ld test_acc=%.4f train_loss=%.4f "
               "step_ms=%.3f wait_ms=%.3f bytes_per_step=%.0f raw_bytes_per_step=%.0f "
               "compression=%.2f\n",
               world, epochs, total_steps, final_acc, final_loss, 1e3 * t_train / total_steps,
               1e3 * t_wait / total_steps, (double)sent / total_steps, (double)raw / total_steps,
               sent ? (double)raw / (double)sent : 0.0);
    }
    printf("MODEL-HASH %016llx\n", (unsigned long long)hash);
    fflush(stdout);
    st = psagg_close(ctx);
    free(order);
    free(shard);
    free(d.x);
    free(d.y);
    free(data_path);
    return st ? psagg__failed("psagg_close", st) : 0;
}
