/* thc_scalar.c - the workers' side of thc on any x86-64 (cpu/thc_body.h). Layer: kernels. */
#include <math.h>

#define PSAGG_THC_WORKER psagg__thc_worker_scalar
#define PSAGG_THC_PLAIN  /* (the reference: no intrinsics, whatever the compiler's flags) */
#include "thc_body.h"
