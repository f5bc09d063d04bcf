/* base/version.c - psagg_version (psagg/types.h): the project's version, from CMake. */
#include "psagg/types.h"

#ifndef PSAGG_VERSION_TEXT
#error "PSAGG_VERSION_TEXT comes from CMake (project(psagg VERSION ...))"
#endif

const char *psagg_version(void)
{
    return PSAGG_VERSION_TEXT;
}
