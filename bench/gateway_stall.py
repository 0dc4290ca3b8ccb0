#!/usr/bin/env python3
"""The gateway's loop under large bodies: how long one client's GET /v1/models waits while
others send bodies of megabytes of token ids.

Usage: bench/gateway_stall.py HOST:PORT [IDS [CONCURRENT [EXTRA]]]

A prober sends GET /v1/models on one keep-alive connection, again and again, while CONCURRENT
clients each send one POST /v1/completions whose prompt is IDS token ids (each 1, max_tokens 1;
EXTRA, e.g. ',"temperature":-1', is appended to the body's fields). Prints the prober's median
and largest waits. The loop should never block: a wait far above the median is the loop doing a
body's work itself (found by an outside probe in the forty-first session: freeing the parsed tree
of an 8 MB body took about 0.1 s on the loop). A measurement, not a test: no figure is asserted.
"""
import socket
import sys
import threading
import time


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    n_ids = int(sys.argv[2]) if len(sys.argv) > 2 else 4000000
    conc = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    extra = sys.argv[4] if len(sys.argv) > 4 else ""
    body = ('{"prompt":[' + ",".join(["1"] * n_ids) + '],"max_tokens":1' + extra + "}").encode()
    addr = (host, int(port))

    def send():
        s = socket.create_connection(addr)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        s.settimeout(120)
        while s.recv(65536):
            pass
        s.close()

    waits, stop = [], threading.Event()

    def probe():
        s = socket.create_connection(addr)
        s.settimeout(30)
        while not stop.is_set():
            t = time.monotonic()
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            d = b""
            while not d.endswith(b"}"):
                chunk = s.recv(4096)
                if not chunk:
                    raise SystemExit("the gateway closed the prober's connection")
                d += chunk
            waits.append(time.monotonic() - t)
        s.close()

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    senders = [threading.Thread(target=send) for _ in range(conc)]
    for th in senders:
        th.start()
    for th in senders:
        th.join()
    took = time.monotonic() - t0
    time.sleep(0.3)
    stop.set()
    prober.join()
    waits.sort()
    print(f"ids {n_ids} concurrent {conc} body {len(body)} B: sent and answered in {took:.2f} s; "
          f"GET /v1/models x{len(waits)}: median {waits[len(waits) // 2] * 1e3:.2f} ms, "
          f"largest {waits[-1] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
