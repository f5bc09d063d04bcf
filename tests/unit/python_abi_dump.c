/*
 * python_abi_dump.c - the C side of unit.python_abi: prints, as JSON, the layout of every
 * public struct of psagg.h and psagg/types.h (sizeof, and each field's name, offset and size in
 * declaration order), every public constant (enum members, #define'd flags and keys) and the
 * psagg_status codes. check_python_abi.py compares this with the Python package's ctypes
 * structures and tables, and checks that the lists here are complete against the headers (so
 * a field or constant added to psagg.h but not here fails too).
 */
#include <stddef.h>
#include <stdio.h>

#include "psagg.h"

static int first;

static void begin(const char *key)
{
    printf("%s\"%s\": {", first ? "" : ",\n", key);
    first = 0;
}

static void struct_begin(const char *name, size_t size, int after)
{
    printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": [", after ? "," : "", name, size);
}

static void field(const char *name, size_t off, size_t size, int *n)
{
    printf("%s[\"%s\", %zu, %zu]", (*n)++ ? ", " : "", name, off, size);
}

static void value(const char *name, long long v, int *n)
{
    printf("%s\n  \"%s\": %lld", (*n)++ ? "," : "", name, v);
}

#define STRUCT(T)    struct_begin(#T, sizeof(T), ns), nf = 0
#define FIELD(T, f)  field(#f, offsetof(T, f), sizeof(((T *)0)->f), &nf)
#define STRUCT_END() printf("]}"), ns = 1
#define VALUE(c)     value(#c, (long long)(c), &nv)

int main(void)
{
    int ns = 0, nf = 0, nv = 0;

    first = 1;
    printf("{");
    begin("structs");
    STRUCT(psagg_codec);
    FIELD(psagg_codec, id);
    FIELD(psagg_codec, bits);
    FIELD(psagg_codec, bucket);
    FIELD(psagg_codec, rounding);
    FIELD(psagg_codec, k);
    STRUCT_END();
    STRUCT(psagg_tensor_desc);
    FIELD(psagg_tensor_desc, struct_size);
    FIELD(psagg_tensor_desc, name);
    FIELD(psagg_tensor_desc, count);
    FIELD(psagg_tensor_desc, codec);
    FIELD(psagg_tensor_desc, error_feedback);
    FIELD(psagg_tensor_desc, flags);
    FIELD(psagg_tensor_desc, reserved);
    FIELD(psagg_tensor_desc, error_feedback_beta);
    STRUCT_END();
    STRUCT(psagg_timing);
    FIELD(psagg_timing, struct_size);
    FIELD(psagg_timing, queued_ns);
    FIELD(psagg_timing, encode_ns);
    FIELD(psagg_timing, send_ns);
    FIELD(psagg_timing, wait_ns);
    FIELD(psagg_timing, decode_ns);
    FIELD(psagg_timing, total_ns);
    STRUCT_END();
    STRUCT(psagg_stats);
    FIELD(psagg_stats, struct_size);
    FIELD(psagg_stats, bytes_sent);
    FIELD(psagg_stats, bytes_received);
    FIELD(psagg_stats, bytes_raw);
    FIELD(psagg_stats, push_pulls);
    FIELD(psagg_stats, time);
    FIELD(psagg_stats, left_out);
    STRUCT_END();
    STRUCT(psagg_server_optim);
    FIELD(psagg_server_optim, struct_size);
    FIELD(psagg_server_optim, kind);
    FIELD(psagg_server_optim, momentum);
    FIELD(psagg_server_optim, dampening);
    FIELD(psagg_server_optim, beta1);
    FIELD(psagg_server_optim, beta2);
    FIELD(psagg_server_optim, eps);
    FIELD(psagg_server_optim, nesterov);
    FIELD(psagg_server_optim, sync_interval);
    STRUCT_END();
    STRUCT(psagg_membership);
    FIELD(psagg_membership, struct_size);
    FIELD(psagg_membership, epoch);
    FIELD(psagg_membership, rank);
    FIELD(psagg_membership, size);
    FIELD(psagg_membership, elastic);
    FIELD(psagg_membership, joined);
    FIELD(psagg_membership, joiner);
    STRUCT_END();
    STRUCT(psagg_assignment);
    FIELD(psagg_assignment, struct_size);
    FIELD(psagg_assignment, codec);
    FIELD(psagg_assignment, bytes);
    FIELD(psagg_assignment, generation);
    FIELD(psagg_assignment, from_round);
    STRUCT_END();
    printf("\n}");

    begin("constants");
    nv = 0;
    VALUE(PSAGG_SUM);
    VALUE(PSAGG_AVERAGE);
    VALUE(PSAGG_CODEC_DEFAULT);
    VALUE(PSAGG_CODEC_FP32);
    VALUE(PSAGG_CODEC_FP16);
    VALUE(PSAGG_CODEC_BF16);
    VALUE(PSAGG_CODEC_MAXMIN);
    VALUE(PSAGG_CODEC_TOPK);
    VALUE(PSAGG_CODEC_THC);
    VALUE(PSAGG_ROUND_STOCHASTIC);
    VALUE(PSAGG_ROUND_NEAREST);
    VALUE(PSAGG_TENSOR_PARAMETER);
    VALUE(PSAGG_TENSOR_RARE);
    VALUE(PSAGG_ALL_KEYS);
    VALUE(PSAGG_BROADCAST_MAX);
    VALUE(PSAGG_VERSION_MAJOR);
    VALUE(PSAGG_VERSION_MINOR);
    printf("\n}");

    begin("statuses");
    nv = 0;
    VALUE(PSAGG_OK);
    VALUE(PSAGG_EINVAL);
    VALUE(PSAGG_ENONFINITE);
    VALUE(PSAGG_ERANGE);
    VALUE(PSAGG_EBADLEN);
    VALUE(PSAGG_EBADMETA);
    VALUE(PSAGG_ENOMEM);
    VALUE(PSAGG_EAGAIN);
    VALUE(PSAGG_ETIMEDOUT);
    VALUE(PSAGG_EUNSUPPORTED);
    VALUE(PSAGG_ECONFIG);
    VALUE(PSAGG_EPROTO);
    VALUE(PSAGG_EPEER);
    VALUE(PSAGG_EMISMATCH);
    VALUE(PSAGG_EFABRIC);
    VALUE(PSAGG_EIO);
    VALUE(PSAGG_ECLOSED);
    VALUE(PSAGG_ECUDA);
    printf("\n}}\n");
    return 0;
}
