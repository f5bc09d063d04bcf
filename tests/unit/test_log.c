/*
 * test_log.c - base/log.c's comma list of ranks for messages (psagg__list_int): the list, a
 * list that does not fit (ends with "..." once, stays NUL-ended, never past its buffer), a
 * buffer with room for "..." only, and one too small for even that.
 */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "testutil.h"

int main(void)
{
    char buf[16], tiny[4];
    size_t used = 0;

    memset(buf, 'x', sizeof buf);
    buf[0] = '\0';
    for (int r = 0; r < 3; r++)
        used = psagg__list_int(buf, sizeof buf, used, r * 5);
    CHECK(!strcmp(buf, "0,5,10") && used == 6, "list '%s' (%zu bytes)", buf, used);
    used = psagg__list_int(buf, sizeof buf, used, -1);
    CHECK(!strcmp(buf, "0,5,10,-1") && used == 9, "negative '%s'", buf);
    /* ",1234" would leave no room for a later "...": the list ends, once */
    for (int r = 1234; r < 1240; r++)
        used = psagg__list_int(buf, sizeof buf, used, r);
    CHECK(!strcmp(buf, "0,5,10,-1...") && used == strlen(buf), "full list '%s' (%zu)", buf, used);
    CHECK(used < sizeof buf, "past the buffer");

    tiny[0] = '\0';
    used = psagg__list_int(tiny, sizeof tiny, 0, 7);
    CHECK(!strcmp(tiny, "...") && used == 3, "tiny '%s'", tiny);
    used = psagg__list_int(tiny, sizeof tiny, used, 8);
    CHECK(!strcmp(tiny, "...") && used == 3, "tiny, again '%s'", tiny);
    tiny[0] = '\0';
    used = psagg__list_int(tiny, 3, 0, 1);
    CHECK(used == 0 && tiny[0] == '\0', "3 bytes: '%s'", tiny);
    printf("test_log: passed\n");
    return 0;
}
