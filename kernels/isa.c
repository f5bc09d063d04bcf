/*
 * isa.c - which implementation of the codecs runs (kernels/codec.h: psagg__codec_isa and
 * psagg__codec_set_isa; kernels/cpu/impl.h: psagg__impl_current): the best this CPU and build
 * support, or PSAGG_CODEC_ISA. Layer: kernels.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/codec.h"
#include "kernels/cpu/impl.h"

static const psagg__codec_impl *const impls[PSAGG_ISA_COUNT] = {
    &psagg__impl_scalar, &psagg__impl_avx2, &psagg__impl_avx512};

static const char *const isa_names[PSAGG_ISA_COUNT] = {"scalar", "avx2", "avx512"};

const char *psagg__isa_name(psagg__isa isa)
{
    if ((int)isa < 0 || isa >= PSAGG_ISA_COUNT)
        return "unknown";
    return isa_names[isa];
}

#if defined(__x86_64__) || defined(__i386__)
/*
 * What this CPU and OS can run, from CPUID and XCR0 (the OS must save the AVX and AVX-512
 * registers). By hand rather than __builtin_cpu_supports, which clang does not know f16c for.
 */
enum { CPU_AVX2 = 1, CPU_AVX512 = 2 };

static int cpu_features(void)
{
    unsigned a, b, c, d, xcr0_lo, xcr0_hi;
    int avx2, avx512;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    /* F16C (ecx 29), OSXSAVE (27), AVX (28) */
    if ((c & (1u << 29 | 1u << 27 | 1u << 28)) != (1u << 29 | 1u << 27 | 1u << 28))
        return 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & 0x6) != 0x6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    /* AVX2 (ebx 5), BMI2 (8); AVX-512 F (16), DQ (17), BW (30), VL (31) and its state */
    avx2 = (b & (1u << 5 | 1u << 8)) == (1u << 5 | 1u << 8);
    avx512 = avx2 &&
             (b & (1u << 16 | 1u << 17 | 1u << 30 | 1u << 31)) ==
                 (1u << 16 | 1u << 17 | 1u << 30 | 1u << 31) &&
             (xcr0_lo & 0xE0) == 0xE0;
    return (avx2 ? CPU_AVX2 : 0) | (avx512 ? CPU_AVX512 : 0);
}
#endif

int psagg__isa_supported(psagg__isa isa)
{
    switch (isa) {
    case PSAGG_ISA_SCALAR:
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    case PSAGG_ISA_AVX2:
        return psagg__impl_avx2.fp_encode && (cpu_features() & CPU_AVX2);
    case PSAGG_ISA_AVX512:
        return psagg__impl_avx512.fp_encode && (cpu_features() & CPU_AVX512);
#endif
    default:
        return 0;
    }
}

static _Atomic int current_isa = -1;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void isa_init(void)
{
    psagg__isa best = PSAGG_ISA_SCALAR, want;
    const char *env = getenv("PSAGG_CODEC_ISA");
    int i;

    if (psagg__isa_supported(PSAGG_ISA_AVX512))
        best = PSAGG_ISA_AVX512;
    else if (psagg__isa_supported(PSAGG_ISA_AVX2))
        best = PSAGG_ISA_AVX2;
    want = best;
    if (env && *env) {
        for (i = 0; i < PSAGG_ISA_COUNT; i++)
            if (!strcmp(env, isa_names[i]))
                break;
        if (i == PSAGG_ISA_COUNT)
            fprintf(stderr,
                    "psagg: PSAGG_CODEC_ISA=%s is not one of scalar|avx2|avx512; using %s\n", env,
                    isa_names[best]);
        else if (!psagg__isa_supported((psagg__isa)i))
            fprintf(stderr, "psagg: PSAGG_CODEC_ISA=%s is not supported on this CPU; using %s\n",
                    env, isa_names[best]);
        else
            want = (psagg__isa)i;
    }
    /* psagg__codec_set_isa may have run first; it wins. */
    int expected = -1;
    atomic_compare_exchange_strong(&current_isa, &expected, (int)want);
}

psagg__isa psagg__codec_isa(void)
{
    pthread_once(&isa_once, isa_init);
    return (psagg__isa)atomic_load(&current_isa);
}

psagg_status psagg__codec_set_isa(psagg__isa isa)
{
    if ((int)isa < 0 || isa >= PSAGG_ISA_COUNT)
        return psagg__fail(PSAGG_EINVAL, "codec ISA %d unknown", (int)isa);
    if (!psagg__isa_supported(isa))
        return psagg__fail(PSAGG_EUNSUPPORTED, "codec ISA %s is not supported on this CPU",
                           isa_names[isa]);
    pthread_once(&isa_once, isa_init);
    atomic_store(&current_isa, (int)isa);
    return PSAGG_OK;
}

const psagg__codec_impl *psagg__impl_current(void)
{
    return impls[psagg__codec_isa()];
}
