/*
 * psagg/types.h - the types every layer of psagg shares: status codes, codec descriptions.
 *
 * Layer: base (the bottom). Installed next to psagg.h, which includes it; everything in
 * common/, kernels/, server/ and worker/ may include it, and it includes nothing of psagg's.
 * The functions declared here are implemented in the base layer (common/base/error.c).
 */
#ifndef PSAGG_TYPES_H
#define PSAGG_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* PSAGG_API: the mark of a function libpsagg exports (psagg.h says more) */
#ifndef PSAGG_API
#if defined(__GNUC__) || defined(__clang__)
#define PSAGG_API __attribute__((visibility("default")))
#else
#define PSAGG_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: 0 is success, failures are negative. Grouped by what failed. */
typedef enum psagg_status {
    PSAGG_OK = 0,
    /* the call or one buffer */
    PSAGG_EINVAL = -1,       /* an argument is out of its documented range */
    PSAGG_ENONFINITE = -2,   /* NaN or Inf in an input */
    PSAGG_ERANGE = -3,       /* a finite value the codec cannot represent */
    PSAGG_EBADLEN = -4,      /* a buffer's length does not match its codec and count */
    PSAGG_EBADMETA = -5,     /* an encoded buffer's meta (scale, min) is not valid */
    PSAGG_ENOMEM = -6,       /* out of memory */
    PSAGG_EAGAIN = -7,       /* not done yet; try again */
    PSAGG_ETIMEDOUT = -8,    /* a deadline passed */
    PSAGG_EUNSUPPORTED = -9, /* not available in this build or on this machine */
    /* configuration */
    PSAGG_ECONFIG = -20, /* bad configuration (file:line in the message) */
    /* one peer */
    PSAGG_EPROTO = -30,    /* a peer sent a bad frame (peer and field in the message) */
    PSAGG_EPEER = -31,     /* a peer closed, died or could not be reached */
    PSAGG_EMISMATCH = -32, /* workers declared different tensors */
    /* the whole job */
    PSAGG_EFABRIC = -40, /* libfabric failed */
    PSAGG_EIO = -41,     /* an operating-system call failed */
    PSAGG_ECLOSED = -42, /* the context is closed or the job was aborted */
    PSAGG_ECUDA = -43,   /* a CUDA call failed */
} psagg_status;

/* A short constant description of a status code. */
PSAGG_API const char *psagg_strerror(int status);

/* The detailed message of the calling thread's most recent failure ("" if none). */
PSAGG_API const char *psagg_last_error(void);

/* This library's version, "MAJOR.MINOR.PATCH" (the psagg Python package refuses another). */
PSAGG_API const char *psagg_version(void);

/* Codecs. Their wire formats are specified byte for byte in kernels/codec.h. */
typedef enum psagg_codec_id {
    PSAGG_CODEC_DEFAULT = -1, /* in a tensor declaration: take [codec] from the config */
    PSAGG_CODEC_FP32 = 0,
    PSAGG_CODEC_FP16 = 1,
    PSAGG_CODEC_BF16 = 2,
    PSAGG_CODEC_MAXMIN = 3,
    PSAGG_CODEC_TOPK = 4, /* sparse: per block the k entries of largest magnitude, b bits each */
    PSAGG_CODEC_THC = 5,  /* integer aggregation: rotated, b-bit indices the servers add */
} psagg_codec_id;

typedef enum psagg_rounding {
    PSAGG_ROUND_STOCHASTIC = 0, /* unbiased; counter-based RNG, reproducible */
    PSAGG_ROUND_NEAREST = 1,
} psagg_rounding;

typedef struct psagg_codec {
    psagg_codec_id id;
    uint32_t bits;           /* maxmin: 1..8 bits per element; topk: 2..8 per kept value;
                                thc: 2 or 4; ignored otherwise */
    uint32_t bucket;         /* maxmin: elements per bucket, a multiple of 64; 0 = 1024;
                                topk: elements per block, a power of two 256..65536; 0 = 4096;
                                thc: the rotation's block, a power of two 64..65536; 0 = 1024 */
    psagg_rounding rounding; /* maxmin, topk */
    uint32_t k;              /* topk: entries kept per block, 1..bucket; ignored otherwise */
} psagg_codec;

#ifdef __cplusplus
}
#endif
#endif /* PSAGG_TYPES_H */
