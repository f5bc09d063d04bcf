#!/usr/bin/env python3
"""netcluster_tcpperf.py — a minimal iperf-like TCP throughput check (standard library only).

  netcluster_tcpperf.py recv --bind ADDR [--port 5201] [--streams 1] [--timeout 60]
  netcluster_tcpperf.py send --to ADDR [--port 5201] [--seconds 3] [--streams 1]

The receiver accepts --streams connections, counts bytes until every sender closes, and
prints one line:  TCPPERF bytes=<n> seconds=<s> gbit_per_s=<x>
(time from the first byte received to the last, so connection set-up is not counted).
The sender writes 1 MiB buffers for --seconds per stream. Used by tests/functional/
test_netcluster.sh and to measure the shaped links of deploy/netcluster.sh.
"""
import argparse
import socket
import sys
import threading
import time

BUF = 1 << 20


def recv(args):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((args.bind, args.port))
    ls.listen(args.streams)
    ls.settimeout(args.timeout)
    print("TCPPERF listening", flush=True)
    conns = []
    for _ in range(args.streams):
        c, _ = ls.accept()
        c.settimeout(args.timeout)
        conns.append(c)
    total = [0] * len(conns)
    first = [None]
    last = [0.0]
    lock = threading.Lock()

    def drain(k, c):
        buf = bytearray(BUF)
        while True:
            n = c.recv_into(buf)
            if n == 0:
                break
            now = time.perf_counter()
            with lock:
                if first[0] is None:
                    first[0] = now
                last[0] = now
            total[k] += n
        c.close()

    ths = [threading.Thread(target=drain, args=(k, c)) for k, c in enumerate(conns)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    nbytes = sum(total)
    secs = (last[0] - first[0]) if first[0] is not None else 0.0
    gbps = nbytes * 8 / secs / 1e9 if secs > 0 else 0.0
    print(f"TCPPERF bytes={nbytes} seconds={secs:.3f} gbit_per_s={gbps:.3f}", flush=True)


def send(args):
    payload = b"\x5a" * BUF

    def one():
        deadline = time.monotonic() + 30
        while True:
            try:
                s = socket.create_connection((args.to, args.port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            s.sendall(payload)
        s.close()

    ths = [threading.Thread(target=one) for _ in range(args.streams)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, default=5201)
    r.add_argument("--streams", type=int, default=1)
    r.add_argument("--timeout", type=float, default=60)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, default=5201)
    s.add_argument("--seconds", type=float, default=3)
    s.add_argument("--streams", type=int, default=1)
    args = ap.parse_args()
    recv(args) if args.mode == "recv" else send(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
