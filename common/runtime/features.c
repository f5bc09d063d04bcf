/* runtime/features.c - see runtime/features.h. */
#include "runtime/features.h"

#include <string.h>

static int elastic_on(const psagg__config *c)
{
    return c->elastic;
}
static int quorum_on(const psagg__config *c)
{
    return c->quorum > 0;
}
static int checkpoint_on(const psagg__config *c)
{
    return c->checkpoint_dir[0] != '\0';
}
static int optimizer_on(const psagg__config *c)
{
    return c->optimizer != 0; /* PSAGG_OPTIM_NONE */
}
static int adaptive_on(const psagg__config *c)
{
    return c->adaptive;
}
static int replicas_on(const psagg__config *c)
{
    return c->server_replicas > 0;
}

const psagg__feature psagg__features[PSAGG_F_COUNT] = {
    [PSAGG_F_ELASTIC] = {"elastic", "cluster", "elastic", "[cluster] elastic = on", elastic_on},
    [PSAGG_F_QUORUM] = {"quorum", "server", "quorum", "[server] quorum", quorum_on},
    [PSAGG_F_CHECKPOINT] = {"checkpoints", "server", "checkpoint_dir", "[server] checkpoint_dir",
                            checkpoint_on},
    [PSAGG_F_OPTIMIZER] = {"server optimizer", "server", "optimizer", "[server] optimizer",
                           optimizer_on},
    [PSAGG_F_ADAPTIVE] = {"adaptive codecs", "codec", "adaptive", "[codec] adaptive = on",
                          adaptive_on},
    [PSAGG_F_DEVICE] = {"device buffers", NULL, NULL, "psagg_push_pull_cuda", NULL},
    [PSAGG_F_REPLICAS] = {"server replicas", "cluster", "server_replicas",
                          "[cluster] server_replicas", replicas_on},
};

/*
 * Every pair that is refused, and the pairs that work in a way worth a sentence. The refused
 * ones say why in words a user can act on; a change that makes one work moves it to works.
 */
const psagg__combo psagg__combos[] = {
    {PSAGG_F_ELASTIC, PSAGG_F_QUORUM, 0,
     "a round closes without stragglers among the live workers; the bitmap names every rank, "
     "and a joiner's first rounds wait for its push"},
    {PSAGG_F_ELASTIC, PSAGG_F_CHECKPOINT, 0,
     "any worker may ask for a checkpoint; a resumed job starts with the workers it is given"},
    {PSAGG_F_ELASTIC, PSAGG_F_OPTIMIZER, 0, "a joiner takes the servers' weights when admitted"},
    {PSAGG_F_ELASTIC, PSAGG_F_ADAPTIVE, 0,
     "a worker that dies leaves; a joiner takes the members' codec assignments at the barrier "
     "that admits it (which waits for a statistics round's push and solve in flight) and "
     "measures, pushes and solves with them from its first round"},
    {PSAGG_F_QUORUM, PSAGG_F_ADAPTIVE, 1,
     "a left-out push's statistics would be missing from the codec choice"},
    {PSAGG_F_QUORUM, PSAGG_F_CHECKPOINT, 0,
     "a checkpoint is a collective then: every worker calls psagg_checkpoint at the same step "
     "(rounds may close without one), and the servers write it once all have"},
    {PSAGG_F_QUORUM, PSAGG_F_OPTIMIZER, 0, "a GRAD round may close without a straggler"},
    {PSAGG_F_QUORUM, PSAGG_F_DEVICE, 1,
     "a left-out push goes back into the residual, which lives on the device and has no carry "
     "there yet (refused at the call: push from host memory)"},
    {PSAGG_F_ADAPTIVE, PSAGG_F_DEVICE, 1,
     "the CUDA path encodes in the declared codec only (refused at the call for an adaptive "
     "tensor: push it from host memory)"},
    {PSAGG_F_OPTIMIZER, PSAGG_F_DEVICE, 1,
     "a parameter's INIT, PULL and trailer are written on the host (refused at the call for a "
     "parameter: push it from host memory)"},
    {PSAGG_F_ADAPTIVE, PSAGG_F_OPTIMIZER, 1,
     "a parameter's update is the weights' delta in its declared codec"},
    {PSAGG_F_CHECKPOINT, PSAGG_F_OPTIMIZER, 0,
     "a checkpoint holds the weights and the optimizer's state"},
    {PSAGG_F_REPLICAS, PSAGG_F_ELASTIC, 0,
     "every membership change is a server view, decided by a majority of the members before it "
     "(so a job goes on while fewer than half of its members die at once); a joiner is "
     "admitted by a view at the members' barrier and takes their tensors' rounds (a "
     "parameter's INIT and PULL rounds too: the same optimizer step); with [server] quorum "
     "too; a chunk with "
     "copies (a parameter's, or any with a server residual) goes to its copies before its "
     "owner, and its copies step each round with the pushes its owner summed (whose bitmap "
     "each worker's next push carries), so a worker that dies between two sends is in no sum "
     "or left out by the copies too"},
    {PSAGG_F_REPLICAS, PSAGG_F_QUORUM, 0,
     "a round the lost owner closed without a straggler is not summed again: a worker that has "
     "its update relays it to the new owner, which sends those bytes, bitmap and all; a chunk "
     "with copies (a parameter's, or any with a server residual) is stepped by its copies with "
     "the pushes its owner summed, whose bitmap each worker's next push carries; a server that "
     "comes back takes no chunk back (its owner may close a straggler's round while the return "
     "is decided), and with chunks with copies it copies none (the job does not pause for it)"},
    {PSAGG_F_REPLICAS, PSAGG_F_OPTIMIZER, 0,
     "the workers push a parameter chunk to its owner and to its copies, which run the same "
     "rounds (the same weights, optimizer state and update bytes); a copy takes over a dead "
     "owner's chunk; a server that comes back receives the state of the chunks it holds "
     "(relayed by a worker, STATE frames) and owns and copies them again"},
    {PSAGG_F_REPLICAS, PSAGG_F_CHECKPOINT, 0,
     "each server writes the parameter chunks it owns in the current server view (a dead "
     "server's too, once taken over); a resumed server takes each chunk it holds from the "
     "newest checkpoint whose files hold every chunk (a commit cut short falls back to the one "
     "before), so every server's checkpoint_dir must hold every server's files (shared, or "
     "copied there); a server lost during a checkpoint, or a chunk taken over and not caught "
     "up yet, fails that call and leaves the checkpoint before whole (ask again after the next "
     "step)"},
    {PSAGG_F_REPLICAS, PSAGG_F_ADAPTIVE, 0,
     "the statistics travel as a sum tensor: their rounds in flight are pushed again to the new "
     "owner like a gradient's, and every worker solves the same sums; a round's generation is "
     "the schedule's, so a new owner checks pushes as the old one did"},
    {PSAGG_F_REPLICAS, PSAGG_F_DEVICE, 1,
     "the pushes a worker keeps for a takeover are not tested on the CUDA path (refused at the "
     "call: push from host memory)"},
};
const size_t psagg__n_combos = sizeof psagg__combos / sizeof psagg__combos[0];

const psagg__combo *psagg__combo_of(psagg__feature_id a, psagg__feature_id b)
{
    for (size_t i = 0; i < psagg__n_combos; i++)
        if ((psagg__combos[i].a == a && psagg__combos[i].b == b) ||
            (psagg__combos[i].a == b && psagg__combos[i].b == a))
            return &psagg__combos[i];
    return NULL;
}

const psagg__combo *psagg__features_refused(const psagg__config *cfg)
{
    for (size_t i = 0; i < psagg__n_combos; i++) {
        const psagg__combo *c = &psagg__combos[i];
        const psagg__feature *fa = &psagg__features[c->a], *fb = &psagg__features[c->b];
        if (c->refused && fa->on && fb->on && fa->on(cfg) && fb->on(cfg))
            return c;
    }
    return NULL;
}

void psagg__features_print(FILE *out)
{
    fprintf(out, "| | ");
    for (int b = 0; b < PSAGG_F_COUNT; b++)
        fprintf(out, "%s%s", psagg__features[b].name, b + 1 < PSAGG_F_COUNT ? " | " : " |\n");
    fprintf(out, "|---|");
    for (int b = 0; b < PSAGG_F_COUNT; b++)
        fprintf(out, "---|");
    fprintf(out, "\n");
    for (int a = 0; a < PSAGG_F_COUNT; a++) {
        fprintf(out, "| %s (`%s`) |", psagg__features[a].name, psagg__features[a].spelled);
        for (int b = 0; b < PSAGG_F_COUNT; b++) {
            const psagg__combo *c = psagg__combo_of((psagg__feature_id)a, (psagg__feature_id)b);
            fprintf(out, " %s |", a == b ? "" : c && c->refused ? "refused" : "works");
        }
        fprintf(out, "\n");
    }
    fprintf(out, "\n");
    for (size_t i = 0; i < psagg__n_combos; i++) {
        const psagg__combo *c = &psagg__combos[i];
        fprintf(out, "- **%s with %s**: %s%s.\n", psagg__features[c->a].name,
                psagg__features[c->b].name, c->refused ? "refused: " : "", c->why);
    }
}
