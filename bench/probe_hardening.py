#!/usr/bin/env python3
"""Probes a running `tiergate serve` the way an attacker and a rolling restart would, and prints figures.

  python3 bench/probe_hardening.py --url http://127.0.0.1:8080 [--pid PID]

1. stalled bodies: 600 connections from 127.0.0.1 send headers and one byte of a 100-byte body and stall;
   then 20 normal requests from 127.0.0.2 and the probes. Prints how many stalled connections the server
   accepted or refused (per-peer limit) and the normal requests' statuses.
2. trickled bodies: 50 connections from 127.0.0.3 send a body one byte every 200 ms; prints when and how the
   server answered (the total body deadline, server.body_timeout_ms).
3. with --pid: 16 keep-alive clients from 127.0.0.4 send requests back to back; after 2 s the server gets
   SIGTERM; prints requests answered, requests that were sent and then reset (must be 0), and connections
   refused after the listener closed (nothing was sent on those).

Loopback addresses other than 127.0.0.1 stand in for other clients (Linux routes all of 127/8 to lo).
"""

import argparse
import os
import signal
import socket
import threading
import time
from urllib.parse import urlparse

CHAT = b'{"model":"classify","messages":[{"role":"user","content":"my card was stolen"}]}'


def connect(host, port, source, timeout=10.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect((host, port))
    return s


def request(method, path, body=b"", close=False):
    head = f"{method} {path} HTTP/1.1\r\nhost: probe\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    if close:
        head += "connection: close\r\n"
    return head.encode() + b"\r\n" + body


def read_response(s):
    """(status, lower-cased head, body) of one Content-Length framed response; raises on EOF/reset."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("eof")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    head = head.decode("latin-1").lower()
    status = int(head.split()[1])
    length = 0
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("eof in body")
        rest += chunk
    return status, head, rest[:length]


def once(host, port, source, method, path, body=b""):
    s = connect(host, port, source)
    try:
        s.sendall(request(method, path, body, close=True))
        return read_response(s)[0]
    finally:
        s.close()


def stalled(host, port):
    held, refused = [], 0
    for _ in range(600):
        try:
            s = connect(host, port, "127.0.0.1", timeout=2)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: probe\r\ncontent-type: application/json\r\n"
                      b"content-length: 100\r\n\r\n{")
            held.append(s)
        except OSError:
            refused += 1
    time.sleep(0.5)
    # Connections the server refused answered 503 and closed.
    answered_503 = 0
    for s in held:
        s.setblocking(False)
        try:
            if s.recv(16).startswith(b"HTTP/1.1 503"):
                answered_503 += 1
        except BlockingIOError:
            pass
        except OSError:
            pass
        s.setblocking(True)
    t = time.time()
    statuses = [once(host, port, "127.0.0.2", "POST", "/v1/chat/completions", CHAT) for _ in range(20)]
    took = (time.time() - t) / 20 * 1000
    health = once(host, port, "127.0.0.2", "GET", "/health")
    ready = once(host, port, "127.0.0.2", "GET", "/ready")
    for s in held:
        s.close()
    print(f"stalled bodies: 600 connections from 127.0.0.1: {len(held) - answered_503} held open, "
          f"{answered_503} answered 503 (per-peer limit), {refused} not connected")
    print(f"  meanwhile from 127.0.0.2: 20 chat requests -> {sorted(set(statuses))} "
          f"(mean {took:.1f} ms), /health {health}, /ready {ready}")


def trickled(host, port):
    results = []

    def one():
        s = connect(host, port, "127.0.0.3", timeout=0.2)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: probe\r\ncontent-type: application/json\r\n"
                  b"content-length: 1000\r\n\r\n")
        t = time.time()
        got = b""
        while time.time() - t < 120:
            try:
                s.sendall(b" ")
            except OSError:
                break
            try:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
                if b"\r\n\r\n" in got:
                    break
            except socket.timeout:
                pass
            except OSError:
                break
        results.append((time.time() - t, got.split(b"\r\n", 1)[0].decode("latin-1")))
        s.close()

    threads = [threading.Thread(target=one) for _ in range(50)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    times = sorted(r[0] for r in results)
    answers = sorted({r[1] for r in results})
    print(f"trickled bodies: 50 connections, one byte per 200 ms: answered {answers} after "
          f"{times[0]:.1f}-{times[-1]:.1f} s")


def sigterm(host, port, pid):
    stop = threading.Event()
    ok, reset, refused, closes = [0], [], [0], [0]
    lock = threading.Lock()

    def client():
        req = request("POST", "/v1/chat/completions", CHAT)
        while not stop.is_set():
            try:
                s = connect(host, port, "127.0.0.4")
            except OSError:
                with lock:
                    refused[0] += 1
                return
            with s:
                while True:
                    try:
                        s.sendall(req)
                    except OSError as e:
                        with lock:
                            reset.append(f"send: {e}")
                        return
                    try:
                        status, head, _ = read_response(s)
                    except (OSError, ConnectionError) as e:
                        with lock:
                            reset.append(f"read: {e}")
                        return
                    with lock:
                        ok[0] += 1
                    if "connection: close" in head:
                        with lock:
                            closes[0] += 1
                        break

    threads = [threading.Thread(target=client) for _ in range(16)]
    for th in threads:
        th.start()
    time.sleep(2)
    before = ok[0]
    os.kill(pid, signal.SIGTERM)
    t = time.time()
    ready_503 = None
    while time.time() - t < 2 and ready_503 is None:
        try:
            if once(host, port, "127.0.0.5", "GET", "/ready") == 503:
                ready_503 = time.time() - t
        except OSError:
            break
    for th in threads:
        th.join(timeout=60)
    stop.set()
    print(f"SIGTERM under 16 keep-alive clients: {ok[0]} requests answered ({ok[0] - before} after SIGTERM, "
          f"{closes[0]} with Connection: close), {len(reset)} sent and then reset, {refused[0]} connects "
          f"refused after the listener closed; /ready 503 after "
          f"{'%.0f ms' % (ready_503 * 1000) if ready_503 is not None else 'never seen'}")
    for r in reset[:5]:
        print(f"  reset: {r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, help="the server's pid: also probe SIGTERM under load (stops it)")
    args = ap.parse_args()
    u = urlparse(args.url)
    host, port = u.hostname, u.port or 80
    stalled(host, port)
    trickled(host, port)
    if args.pid:
        sigterm(host, port, args.pid)


if __name__ == "__main__":
    main()
