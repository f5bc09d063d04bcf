/* alloc.c - placeholder, being written */
