#!/usr/bin/env python3
"""fake_server.py PORT RANK N_SERVERS - a process without the job's secret that poses as psagg
server RANK on 127.0.0.1:PORT: it speaks the control channel's start (wire.h: CHALLENGE, reads a
HELLO, answers WELCOME) but cannot make the WELCOME's token (runtime/auth.h), which it fills
with random bytes. A worker must never take it for the server (test_server_failover.sh,
back1-impostor). Prints "HELLO from worker R" per HELLO read; runs until killed."""
import os
import re
import socket
import struct
import sys


def proto_version():
    """PSAGG_PROTO_VERSION as common/runtime/wire.h defines it (a stale one would be refused
    for its version, never reaching the token)."""
    wire = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common",
                        "runtime", "wire.h")
    with open(wire) as fh:
        return int(re.search(r"#define\s+PSAGG_PROTO_VERSION\s+([0-9]+)", fh.read()).group(1))


MAGIC, VERSION = 0x43475350, proto_version()
HELLO, WELCOME, CHALLENGE = 1, 2, 11
WELCOME_BYTES = 432  # sizeof(psagg__ctl_welcome)


def frame(kind, body):
    return struct.pack("<IHHI", MAGIC, kind, VERSION, len(body)) + body


def read_exact(c, n):
    b = b""
    while len(b) < n:
        chunk = c.recv(n - len(b))
        if not chunk:
            raise EOFError
        b += chunk
    return b


def main():
    port, rank, n_servers = (int(a) for a in sys.argv[1:4])
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    while True:
        c, _ = ls.accept()
        try:
            c.sendall(frame(CHALLENGE, os.urandom(16)))
            magic, kind, _, length = struct.unpack("<IHHI", read_exact(c, 12))
            hello = read_exact(c, length)
            if magic != MAGIC or kind != HELLO:
                continue
            worker = struct.unpack_from("<I", hello, 64)[0]
            print("HELLO from worker %d" % worker, flush=True)
            w = bytearray(WELCOME_BYTES)
            struct.pack_into("<III", w, 0, rank, n_servers, 1)  # flags: data_auth
            w[12:28] = os.urandom(16)
            w[28:31] = b"net"
            w[400:432] = os.urandom(32)  # the token it cannot make
            c.sendall(frame(WELCOME, bytes(w)))
        except (EOFError, OSError):
            pass
        finally:
            c.close()


main()
