/* cpu/avx2.c - placeholder, being written */
