/* cpu/avx512.c - placeholder, being written */
