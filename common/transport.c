/* transport.c - placeholder, being written */
