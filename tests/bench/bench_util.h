/* bench_util.h - what psagg's benchmark programs share: model size tables and statistics. */
#ifndef PSAGG_BENCH_UTIL_H
#define PSAGG_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Element counts of a .sizes file (tests/data/models: one count per line, '#' comments) into a
 * malloc'd array; returns the number of tensors, or -1 with "who: file:line: ..." on stderr.
 */
static inline long bench_read_sizes(const char *who, const char *path, uint64_t **out)
{
    FILE *f = fopen(path, "r");
    char line[512];
    long n = 0, cap = 256, lineno = 0;
    uint64_t *v = malloc((size_t)cap * sizeof *v);

    if (!f || !v) {
        fprintf(stderr, "%s: cannot read %s\n", who, path);
        if (f)
            fclose(f);
        free(v);
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#'), *p = line, *end;
        unsigned long long x;
        lineno++;
        if (hash)
            *hash = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p || *p == '\n' || *p == '\r')
            continue;
        x = strtoull(p, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')
            end++;
        if (end == p || *end || x == 0 || n >= 1000000) {
            fprintf(stderr, "%s: %s:%ld: bad element count\n", who, path, lineno);
            fclose(f);
            free(v);
            return -1;
        }
        if (n == cap) {
            uint64_t *w = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!w) {
                fclose(f);
                free(v);
                return -1;
            }
            v = w;
        }
        v[n++] = x;
    }
    fclose(f);
    if (n == 0) {
        fprintf(stderr, "%s: %s: no tensors\n", who, path);
        free(v);
        return -1;
    }
    *out = v;
    return n;
}

/* Basename of path without ".sizes". */
static inline void bench_model_name(const char *path, char *buf, size_t len)
{
    const char *b = strrchr(path, '/');
    char *dot;
    snprintf(buf, len, "%s", b ? b + 1 : path);
    dot = strstr(buf, ".sizes");
    if (dot)
        *dot = '\0';
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quantile q of a sorted array, linear interpolation (numpy's default). */
static inline double bench_quantile(const double *s, int n, double q)
{
    double pos = q * (n - 1);
    int lo = (int)pos;
    int hi = lo + 1 < n ? lo + 1 : lo;
    return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

#endif
