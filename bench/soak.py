#!/usr/bin/env python3
"""A soak of `tiergate serve` on its default config: closed-loop clients, every request's text and
`x-session-id` unique (classify, with the escalations Tier-0 asks for), for --minutes. Every --every seconds
it prints the requests answered so far, their rate, the server's and its workers' RSS, and the ledger's
SQLite file (and WAL) against `feedback.max_bytes`. Run from the repository root after
`cargo build --workspace --bins`, on a quiet machine:

    python3 bench/soak.py --minutes 30 --max-bytes 33554432

The ledger and the batch store go to a temporary folder; the server's log to soak-server.log there.
"""

import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def children(pid):
    """The processes `pid` started, from any of its threads (the workers are spawned off the main one)."""
    kids = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                kids.extend(int(p) for p in f.read().split())
        except OSError:
            pass
    return kids


def client(port, stop, counts, lock, seed):
    rnd = random.Random(seed)
    words = ["card", "refund", "transfer", "pin", "account", "fee", "cash", "app", "limit", "rate"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    n = 0
    while not stop.is_set():
        n += 1
        text = f"my {rnd.choice(words)} {seed}-{n} {rnd.choice(words)} does not work {rnd.random():.6f}"
        body = json.dumps({"model": "classify", "messages": [{"role": "user", "content": text}]})
        headers = {"content-type": "application/json", "x-session-id": f"soak-{seed}-{n}"}
        try:
            conn.request("POST", "/v1/chat/completions", body, headers)
            r = conn.getresponse()
            r.read()
            key = r.status
        except (OSError, http.client.HTTPException):
            key = "transport"
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        with lock:
            counts[key] = counts.get(key, 0) + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--every", type=float, default=60)
    ap.add_argument("--max-bytes", type=int, default=32 << 20)
    ap.add_argument("--binary", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "debug", "tiergate"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tiergate-soak-")
    ledger = os.path.join(tmp, "feedback.sqlite")
    port, admin = 18580, 18581
    log = open(os.path.join(tmp, "soak-server.log"), "w")
    server = subprocess.Popen([
        a.binary, "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
        "--set", f'feedback.path="{ledger}"', "--set", f"feedback.max_bytes={a.max_bytes}",
        "--set", f'batch.data_dir="{os.path.join(tmp, "batches")}"',
    ], stdout=log, stderr=log)
    t0 = time.time()
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/ready")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.time() - t0 > 600 or server.poll() is not None:
            sys.exit(f"the server did not become ready (log: {log.name})")
        time.sleep(0.5)
    stop, lock, counts = threading.Event(), threading.Lock(), {}
    threads = [threading.Thread(target=client, args=(port, stop, counts, lock, i), daemon=True)
               for i in range(a.clients)]
    for t in threads:
        t.start()
    start, last_n, last_t = time.time(), 0, time.time()
    print(f"# ledger {ledger}, max_bytes {a.max_bytes}, {a.clients} clients")
    print("| min | requests | req/s | non-200 | server RSS MiB | workers RSS MiB | ledger MiB | WAL MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    while time.time() - start < a.minutes * 60:
        time.sleep(a.every)
        with lock:
            n = sum(counts.values())
            bad = sum(v for k, v in counts.items() if k != 200)
        now = time.time()
        rate = (n - last_n) / (now - last_t)
        last_n, last_t = n, now
        workers = sum(rss_kib(p) for p in children(server.pid))
        size = lambda p: os.path.getsize(p) / 2**20 if os.path.exists(p) else 0.0
        print(f"| {(now - start) / 60:.1f} | {n} | {rate:.0f} | {bad} | {rss_kib(server.pid) / 1024:.0f} "
              f"| {workers / 1024:.0f} | {size(ledger):.1f} | {size(ledger + '-wal'):.1f} |", flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=35)
    print(f"# answers by status: {counts}")
    server.terminate()
    server.wait(timeout=30)


if __name__ == "__main__":
    main()
