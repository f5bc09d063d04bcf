/* thc_avx512.c - the workers' side of thc, vectorized for AVX-512 by the compiler
   (cpu/thc_body.h). Layer: kernels. */
#include <math.h>

#include "impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define PSAGG_THC_WORKER psagg__thc_worker_avx512
#include "thc_body.h"
#else /* not built for AVX-512: psagg__impl_avx512 is never chosen */
const psagg__thc_worker psagg__thc_worker_avx512 = {0};
#endif
