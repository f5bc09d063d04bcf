/*
 * replay.c - main() for a fuzz target built without libFuzzer: run LLVMFuzzerTestOneInput
 * once on every file named, and on every file in every folder named (not recursive). The
 * seed corpora and any crash inputs kept under tests/fuzz/corpus/ so become regression tests
 * of the ordinary and the ASan builds.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long len;
    if (!f || fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        if (f)
            fclose(f);
        return -1;
    }
    buf = malloc(len ? (size_t)len : 1); /* its own allocation: ASan sees every overread */
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        DIR *d;
        struct dirent *e;
        if (stat(argv[i], &sb) == 0 && !S_ISDIR(sb.st_mode)) {
            bad |= run_file(argv[i]);
            files++;
            continue;
        }
        if (!(d = opendir(argv[i]))) {
            fprintf(stderr, "replay: cannot open %s\n", argv[i]);
            return 1;
        }
        while ((e = readdir(d))) {
            char path[4096];
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            bad |= run_file(path);
            files++;
        }
        closedir(d);
    }
    if (files == 0 || bad) {
        fprintf(stderr, "replay: %s\n", files ? "some inputs could not be read" : "no inputs");
        return 1;
    }
    printf("replay: %d inputs, all properties held\n", files);
    return 0;
}
