/* cpu/scalar.c - placeholder, being written */
