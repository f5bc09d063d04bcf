/*
 * msg_layout.h - the job layout fuzz_msg checks messages against, and make_seeds writes its
 * seed messages for: five tensors in every codec family, some of several chunks, and a
 * parameter tensor (pushes with a trailer, WEIGHTS), over two servers with chunks of 16384
 * elements.
 */
#ifndef PSAGG_TESTS_FUZZ_MSG_LAYOUT_H
#define PSAGG_TESTS_FUZZ_MSG_LAYOUT_H

#include "../testutil.h"
#include "base/error.h"
#include "kernels/codec.h"
#include "runtime/layout.h"

static inline void fuzz_msg_layout(psagg__layout *l)
{
    static const struct {
        const char *name, *codec;
        uint64_t count;
        uint32_t flags;
    } t[] = {{"one", "fp32", 1, 0},
             {"mm4", "maxmin4/512", 5000, 0},
             {"half", "fp16", 3000, 0},
             {"brain", "bf16", 70000, 0},
             {"mm1", "maxmin1/64/nearest", 100000, 0},
             {"par", "fp16", 20000, PSAGG_DECL_PARAM}};
    psagg__ctl_tensor decl[6];
    for (int i = 0; i < 6; i++) {
        psagg_codec c;
        CHECK(psagg_codec_parse(t[i].codec, &c) == PSAGG_OK, "codec %s", t[i].codec);
        CHECK(psagg__tensor_to_wire(t[i].name, t[i].count, &c, &decl[i]) == PSAGG_OK, "decl");
        decl[i].flags = t[i].flags;
    }
    CHECK(psagg__layout_build(decl, 6, 16384, 2, 10, l) == PSAGG_OK, "layout: %s",
          psagg_last_error());
}

#endif
