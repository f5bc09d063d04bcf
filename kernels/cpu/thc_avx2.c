/* thc_avx2.c - the workers' side of thc, vectorized for AVX2 by the compiler (cpu/thc_body.h).
   Layer: kernels. */
#include <math.h>

#include "impl.h"

#if defined(__x86_64__) && defined(__AVX2__)
#define PSAGG_THC_WORKER psagg__thc_worker_avx2
#include "thc_body.h"
#else /* not built for AVX2: psagg__impl_avx2 is never chosen */
const psagg__thc_worker psagg__thc_worker_avx2 = {0};
#endif
