/*
 * mpi_allreduce — the OpenMPI all-reduce baseline for tests/bench/bench_cluster.py.
 *
 *   mpirun ... psagg-bench-mpi-allreduce --model M.sizes [--steps 10] [--warmup 3]
 *                                        [--bucket-mb 25] [--first-bucket-mb 1]
 *
 * Reads a model's gradient tensor sizes (one element count per line, '#' comments), groups
 * them into buckets the way PyTorch DDP does, and times fp32 in-place MPI_Allreduce
 * (MPI_SUM) of every bucket, one fused contiguous buffer per bucket, per step.
 *
 * Bucketing (same rule as gloo_allreduce.py): tensors in reverse registration order (the
 * order their gradients become ready in backward), appended to the current bucket until
 * its size reaches the cap, the first bucket capped at --first-bucket-mb (DDP's 1 MiB
 * first bucket) and the rest at --bucket-mb (DDP's bucket_cap_mb=25); MiB = 2^20 bytes.
 * Tensors are never split.
 *
 * Timing: each step starts after an MPI_Barrier; a step's time is the maximum over ranks
 * (MPI_Reduce MAX) of the time from the barrier to the last bucket's completion. After
 * --warmup untimed steps, --steps timed steps; rank 0 prints
 *   RESULT system=mpi model=<name> ranks=<n> median_ms=<x> p10_ms=<y> p90_ms=<z> ...
 * Benchmarks print figures; they never pass or fail on a time.
 */
#include <mpi.h>

#include "../bench_util.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct bucket {
    size_t elems;
    float *buf;
};

static void die(const char *msg)
{
    fprintf(stderr, "mpi_allreduce: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    const char *model = NULL;
    int steps = 10, warmup = 3;
    double bucket_mb = 25.0, first_mb = 1.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bucket-mb") && i + 1 < argc)
            bucket_mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--first-bucket-mb") && i + 1 < argc)
            first_mb = atof(argv[++i]);
        else {
            if (rank == 0)
                fprintf(stderr,
                        "usage: %s --model M.sizes [--steps N] [--warmup N] [--bucket-mb 25] "
                        "[--first-bucket-mb 1]\n",
                        argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    if (!model || steps < 1 || warmup < 0 || bucket_mb <= 0 || first_mb <= 0)
        die("need --model, --steps >= 1, --warmup >= 0, positive bucket sizes");

    uint64_t *sizes = NULL;
    long nt = bench_read_sizes("mpi_allreduce", model, &sizes);
    if (nt < 0)
        die("cannot read the model");

    /* DDP-style bucketing over the reversed tensor list. */
    struct bucket *bk = calloc((size_t)nt, sizeof(*bk));
    if (!bk)
        die("out of memory");
    int nb = 0;
    size_t total = 0, cur = 0;
    double limit = first_mb * 1048576.0;
    for (long t = nt - 1; t >= 0; t--) {
        cur += sizes[t];
        total += sizes[t];
        if ((double)cur * sizeof(float) >= limit) {
            bk[nb++].elems = cur;
            cur = 0;
            limit = bucket_mb * 1048576.0;
        }
    }
    if (cur)
        bk[nb++].elems = cur;
    for (int b = 0; b < nb; b++) {
        bk[b].buf = malloc(bk[b].elems * sizeof(float));
        if (!bk[b].buf)
            die("out of memory");
        /* zeros: sums stay finite and denormal-free however many steps run */
        memset(bk[b].buf, 0, bk[b].elems * sizeof(float));
    }

    double *times = malloc((size_t)steps * sizeof(double));
    if (!times)
        die("out of memory");
    for (int s = 0; s < warmup + steps; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int b = 0; b < nb; b++)
            MPI_Allreduce(MPI_IN_PLACE, bk[b].buf, (int)bk[b].elems, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        double dt = MPI_Wtime() - t0, mx = 0;
        MPI_Reduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (s >= warmup)
            times[s - warmup] = mx * 1e3;
    }

    if (rank == 0) {
        char name[256];
        bench_model_name(model, name, sizeof(name));
        qsort(times, (size_t)steps, sizeof(double), bench_cmp_double);
        /* ring all-reduce: each rank sends 2(N-1)/N of the data */
        double ring_bytes = 2.0 * (size - 1) / size * (double)total * sizeof(float);
        printf("RESULT system=mpi model=%s ranks=%d median_ms=%.3f p10_ms=%.3f p90_ms=%.3f "
               "min_ms=%.3f steps=%d warmup=%d buckets=%d elements=%zu ring_bytes_per_rank=%.0f\n",
               name, size, bench_quantile(times, steps, 0.5), bench_quantile(times, steps, 0.1),
               bench_quantile(times, steps, 0.9), times[0], steps, warmup, nb, total, ring_bytes);
        fflush(stdout);
    }
    for (int b = 0; b < nb; b++)
        free(bk[b].buf);
    free(bk);
    free(times);
    free(sizes);
    MPI_Finalize();
    return 0;
}
