/*
 * test_timeline.c - base/timeline.c: the file name, the JSON written for spans (phases, args,
 * escaped names), lanes for overlapping spans, more spans than the buffer holds, no timeline
 * without a prefix, and an unwritable path. The JSON itself is parsed by Python in
 * tests/functional/test_timeline.sh; here the text is checked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timeline.h"
#include "testutil.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    CHECK(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    CHECK(buf && fread(buf, 1, (size_t)n, f) == (size_t)n, "read %s", path);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Occurrences of `what` in text[0, len): a plain loop (ASan's strstr and memmem interceptors
 * check the whole rest of the text on every call, which makes counting quadratic) */
static size_t count(const char *text, size_t len, const char *what)
{
    size_t n = 0, wl = strlen(what);
    for (size_t i = 0; i + wl <= len; i++)
        if (text[i] == what[0] && !memcmp(text + i, what, wl))
            n++;
    return n;
}

int main(void)
{
    char dir[] = "/tmp/psagg-test-timeline.XXXXXX", prefix[256], path[300];
    static const char *const keys[] = {"round", "key"};
    psagg__timeline *tl = (psagg__timeline *)1;
    size_t len;
    char *text;
    int n = PSAGG_TIMELINE_BUFFERED + 5; /* many buffer blocks, and one write mid-run */

    /* no prefix: no timeline, and every call takes NULL */
    CHECK(psagg__timeline_open(NULL, "worker", 0, &tl) == PSAGG_OK && tl == NULL, "NULL prefix");
    CHECK(psagg__timeline_open("", "worker", 0, &tl) == PSAGG_OK && tl == NULL, "empty prefix");
    psagg__timeline_span(NULL, &(psagg__span){.name = "x", .cat = "c", .n_phases = 1});
    psagg__timeline_close(NULL, NULL);

    /* an unwritable path is named */
    CHECK(psagg__timeline_open("/nonexistent-dir/t", "server", 2, &tl) == PSAGG_EIO, "bad path");
    CHECK(strstr(psagg_last_error(), "/nonexistent-dir/t.server2.json"), "%s", psagg_last_error());

    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(prefix, sizeof prefix, "%s/t", dir);
    CHECK(psagg__timeline_open(prefix, "worker", 3, &tl) == PSAGG_OK && tl, "%s",
          psagg_last_error());
    /* two overlapping spans: two lanes; a name that needs escaping; phases; a string arg */
    psagg__timeline_span(tl, &(psagg__span){.name = "a \"quoted\"\n\\name",
                                            .cat = "push_pull",
                                            .start_ns = 1000,
                                            .ends = {1500, 4000},
                                            .n_phases = 2,
                                            .keys = keys,
                                            .n_args = 2,
                                            .args = {7, -3},
                                            .str_key = "buffers",
                                            .str_val = "host"});
    psagg__timeline_span(
        tl, &(psagg__span){
                .name = "b", .cat = "round", .start_ns = 2000, .ends = {2999}, .n_phases = 1});
    for (int i = 0; i < n; i++) /* back to back: lane 0 again after the first two */
        psagg__timeline_span(tl, &(psagg__span){.name = "c",
                                                .cat = "round",
                                                .start_ns = 10000 + 10 * (int64_t)i,
                                                .ends = {10000 + 10 * (int64_t)i + 10},
                                                .n_phases = 1});
    psagg__timeline_close(tl, NULL);

    snprintf(path, sizeof path, "%s.worker3.json", prefix);
    text = slurp(path, &len);
    CHECK(text[0] == '[' && !strcmp(text + len - 3, "\n]\n"), "not a closed JSON array");
    CHECK(strstr(text, "\"name\":\"process_name\"") && strstr(text, "{\"name\":\"worker 3\"}"),
          "no process name");
    CHECK(count(text, len, "\"ph\":\"X\"") == (size_t)n + 2, "%zu spans, expected %d",
          count(text, len, "\"ph\":\"X\""), n + 2);
    CHECK(strstr(text, "\"name\":\"a \\\"quoted\\\"\\u000a\\\\name\""), "name not escaped");
    CHECK(strstr(text, "\"dur\":3.000,\"args\":{\"round\":7,\"key\":-3,\"buffers\":\"host\","
                       "\"phase_us\":[0.500,2.500]}}"),
          "the first span's args and phases");
    CHECK(strstr(text, "\"tid\":2,\"name\":\"b\",\"cat\":\"round\"") &&
              strstr(text, "\"dur\":0.999,\"args\":{}}"),
          "the overlapping span is not on lane 1, or has phases");
    CHECK(count(text, len, "\"name\":\"thread_name\"") == 2, "%zu lanes named, expected 2",
          count(text, len, "\"name\":\"thread_name\""));
    CHECK(count(text, len, "\"tid\":1,\"name\":\"c\"") == (size_t)n,
          "back-to-back spans left lane 0");
    free(text);
    unlink(path);
    rmdir(dir);
    printf("test_timeline: passed\n");
    return 0;
}
