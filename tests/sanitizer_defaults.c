/*
 * sanitizer_defaults.c - options and leak suppressions built into every executable and library
 * of a sanitizer build (PSAGG_SANITIZE, PSAGG_FUZZ; top-level CMakeLists.txt), so that they
 * hold wherever a process starts: under ctest, deploy/psagg-local, or over ssh and Slurm,
 * which pass no ASAN_OPTIONS/LSAN_OPTIONS on. Variables in the environment still override.
 */

/*
 * libfabric is built without frame pointers: the fast unwinder stops inside it, before the
 * call that led there, and a suppression could only name libfabric's own functions (which
 * would hide our leaks of its objects too). The slow unwinder gives the whole stack.
 */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "fast_unwind_on_malloc=0";
}

/*
 * libfabric 1.17's native tcp provider ("net") copies an fi_info for every endpoint it opens
 * and never frees the copy: the one psagg opens (608 bytes, under fi_endpoint; reproduced with
 * a 30-line program that opens and closes fabric, domain, CQ, AV and endpoint in order) and the
 * one behind each connection it makes or accepts while reading the CQ (about 600 bytes a
 * connection, under fi_cq_sreadfrom / fi_cq_readfrom). These are libfabric's inline calls into
 * the provider: psagg itself allocates nothing under them, so nothing of ours is hidden.
 */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:fi_endpoint\n"
           "leak:fi_cq_sreadfrom\n"
           "leak:fi_cq_readfrom\n";
}
