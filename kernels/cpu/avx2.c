/* cpu/avx2.c - placeholder */
#include "impl.h"
const psagg_codec_impl psagg_impl_avx2 = {"avx2", NULL, NULL, NULL};
