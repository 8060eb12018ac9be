#!/usr/bin/env python3
"""Feedback abuse, measured against a running tiergate (standard library only).

  feedback_flood.py flood  --url URL --key KEY --rate N --seconds S   bogus-id feedback at N a second
  feedback_flood.py timing --url URL --owner KEY --asker KEY --n N    unknown against foreign ids, side by side

`flood` prints one JSON line: requests sent, the rate achieved and the statuses. `timing` has `owner` make one
answer, then `asker` gives feedback on N ids nobody was given and N times on the owner's id (alternating), and
prints both latency distributions (p50/p90/p99/max, ms) and the two-sample Kolmogorov-Smirnov statistic with its
asymptotic p-value.
"""
import argparse
import json
import math
import random
import os
import threading
import time
import urllib.error
import urllib.request


def post(url, key, body, timeout=10):
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def bogus_id(age_s=5.0):
    ms = int((time.time() - age_s) * 1000) & 0xFFFF_FFFF_FFFF
    return f"chatcmpl-{ms:012x}{int.from_bytes(os.urandom(8), 'big'):016x}"


def flood(a):
    url, stop, lock = f"{a.url}/v1/feedback", time.time() + a.seconds, threading.Lock()
    counts, sent = {}, [0]
    threads = 16
    gap = threads / a.rate

    def worker(k):
        nxt = time.time() + k * gap / threads
        while time.time() < stop:
            now = time.time()
            if now < nxt:
                time.sleep(nxt - now)
            nxt += gap
            code, _ = post(url, a.key, {"id": bogus_id(), "correct": False})
            with lock:
                sent[0] += 1
                counts[code] = counts.get(code, 0) + 1

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.time() - t0
    print(json.dumps({"sent": sent[0], "per_s": round(sent[0] / took, 1), "statuses": counts}))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def ks(x, y):
    """Two-sample Kolmogorov-Smirnov D and its asymptotic p-value (ties counted together: the empirical
    distributions are compared only between distinct values)."""
    x, y = sorted(x), sorted(y)
    i = j = 0
    d = 0.0
    while i < len(x) and j < len(y):
        v = min(x[i], y[j])
        while i < len(x) and x[i] == v:
            i += 1
        while j < len(y) and y[j] == v:
            j += 1
        d = max(d, abs(i / len(x) - j / len(y)))
    n = len(x) * len(y) / (len(x) + len(y))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, max(0.0, min(1.0, p))


def timing(a):
    code, answer = post(
        f"{a.url}/v1/chat/completions",
        a.owner,
        {"model": "classify", "messages": [{"role": "user", "content": "I lost my card"}]},
    )
    assert code == 200, answer
    mine = answer["id"]
    time.sleep(0.2)
    url = f"{a.url}/v1/feedback"
    # Three arms in a fresh random order each round: the other tenant's id (the same one each time), one
    # unknown id repeated the same way (what an attacker would compare it with: the foreign id one digit
    # off), and a fresh unknown id each time (which also shows what repeating one id does by itself).
    foreign, repeated, fresh, codes = [], [], [], set()
    rng = random.Random(a.seed)
    # The foreign id with its last hex digit changed: the same length and the same time in it, never given.
    one_unknown = mine[:-1] + ("0" if mine[-1] != "0" else "1")
    for _ in range(a.n):
        arms = [(mine, foreign), (one_unknown, repeated), (None, fresh)]
        rng.shuffle(arms)
        for ident, times in arms:
            ident = ident or bogus_id()
            t = time.perf_counter()
            code, body = post(url, a.asker, {"id": ident, "correct": True})
            times.append((time.perf_counter() - t) * 1000)
            codes.add((code, body.get("error", {}).get("code")))
    print(f"statuses: {sorted(codes)}")
    print(f"{'ms':>8} {'foreign':>8} {'unknown':>8} {'fresh':>8}")
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)):
        print(f"{name:>8} {pct(foreign, q):8.2f} {pct(repeated, q):8.2f} {pct(fresh, q):8.2f}")
    print(f"n = {a.n} each; Kolmogorov-Smirnov:")
    for name, x, y in (
        ("foreign vs unknown (each one id, repeated)", foreign, repeated),
        ("foreign vs a fresh unknown id each time", foreign, fresh),
        ("unknown repeated vs fresh (no existence differs)", repeated, fresh),
    ):
        d, p = ks(x, y)
        print(f"  {name}: D = {d:.3f}, p = {p:.2f}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("flood")
    f.add_argument("--url", required=True)
    f.add_argument("--key", required=True)
    f.add_argument("--rate", type=float, default=300)
    f.add_argument("--seconds", type=float, default=20)
    t = sub.add_parser("timing")
    t.add_argument("--url", required=True)
    t.add_argument("--owner", required=True)
    t.add_argument("--asker", required=True)
    t.add_argument("--n", type=int, default=300)
    t.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    flood(a) if a.mode == "flood" else timing(a)


if __name__ == "__main__":
    main()
