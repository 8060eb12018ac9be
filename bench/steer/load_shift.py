#!/usr/bin/env python3
"""The load shift of a steered route in `load` mode (issue 47): at each load level, REQUESTS requests through
the steered route, and the share its cheap stage wrote, against the strong stage's busy fraction u as the
route's own policy reads it (`GET /admin/routing?route=ROUTE`, sampled every 0.5 s during the level), with each
stage's latency P50/P95 and its band.

usage: load_shift.py BASE ADMIN ROUTE WORKLOAD.jsonl REQUESTS LEVEL...   LEVEL = CLIENTS:THINK_SECONDS
"""
import json
import random
import sys
import threading
import time
import urllib.request

base, admin, route, workload, requests = sys.argv[1:6]
levels = [tuple(float(x) for x in lv.split(":")) for lv in sys.argv[6:]]
requests = int(requests)
texts = [json.loads(line)["text"] for line in open(workload) if line.strip()]
BANDS = [("Tier-0", 20), ("Tier-1", 200), ("Tier-2", 1000), ("Tier-3", 5000), ("Tier-4", float("inf"))]


def band(ms):
    return next(name for name, top in BANDS if ms <= top)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def one(text):
    body = json.dumps({"model": route, "messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", body, {"content-type": "application/json"})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            return r.headers.get("x-tiergate-stage"), (time.perf_counter() - t) * 1e3
    except urllib.error.HTTPError as e:
        return f"error {e.code}", (time.perf_counter() - t) * 1e3


def level(clients, think):
    lock, out, left = threading.Lock(), [], [requests]
    rng = random.Random(7)

    def client():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
                text = rng.choice(texts)
            out_one = one(text)
            with lock:
                out.append(out_one)
            time.sleep(think)

    us, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            v = json.load(urllib.request.urlopen(f"{admin}/admin/routing?route={route}", timeout=5))
            us.append((v["utilization"], v["theta_eff"]))
            stop.wait(0.5)

    s = threading.Thread(target=sample)
    s.start()
    threads = [threading.Thread(target=client) for _ in range(int(clients))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    s.join()
    took = time.perf_counter() - t0
    stages = sorted({st for st, _ in out})
    u = sum(x for x, _ in us) / len(us)
    theta = sum(x for _, x in us) / len(us)
    print(json.dumps({
        "clients": int(clients), "think_s": think, "requests": len(out), "seconds": round(took, 1),
        "u_mean": round(u, 3), "theta_eff_mean": round(theta, 3),
        "share": {st: round(sum(1 for s2, _ in out if s2 == st) / len(out), 4) for st in stages},
        "latency_ms": {st: {"p50": round(pct([ms for s2, ms in out if s2 == st], 0.5), 1),
                            "p95": round(pct([ms for s2, ms in out if s2 == st], 0.95), 1),
                            "band_p95": band(pct([ms for s2, ms in out if s2 == st], 0.95))} for st in stages},
    }), flush=True)


for clients, think in levels:
    level(clients, think)
