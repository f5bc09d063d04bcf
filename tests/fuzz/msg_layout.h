/*
 * msg_layout.h - the job layout fuzz_msg checks messages against, and make_seeds writes its
 * seed messages for: five tensors in every codec family, some of several chunks, over two
 * servers with chunks of 16384 elements.
 */
#ifndef PSAGG_TESTS_FUZZ_MSG_LAYOUT_H
#define PSAGG_TESTS_FUZZ_MSG_LAYOUT_H

#include "../testutil.h"
#include "base/error.h"
#include "kernels/codec.h"
#include "runtime/layout.h"

static inline void fuzz_msg_layout(psagg_layout *l)
{
    static const struct {
        const char *name, *codec;
        uint64_t count;
    } t[] = {{"one", "fp32", 1},
             {"mm4", "maxmin4/512", 5000},
             {"half", "fp16", 3000},
             {"brain", "bf16", 70000},
             {"mm1", "maxmin1/64/nearest", 100000}};
    psagg_ctl_tensor decl[5];
    for (int i = 0; i < 5; i++) {
        psagg_codec c;
        CHECK(psagg_codec_parse(t[i].codec, &c) == PSAGG_OK, "codec %s", t[i].codec);
        CHECK(psagg_tensor_to_wire(t[i].name, t[i].count, &c, &decl[i]) == PSAGG_OK, "decl");
    }
    CHECK(psagg_layout_build(decl, 5, 16384, 2, 10, l) == PSAGG_OK, "layout: %s",
          psagg_last_error());
}

#endif
