#!/usr/bin/env python3
"""The learning loop's figures (loop.sh), on the untouched test rows: per head, Tier-0 alone, the escalated
share and the hybrid at the fixed θ, from `eval --hybrid --rows` files (the LLM's scores over the 30% most
ambiguous test rows), with a paired sign test of Tier-0 alone against day 0; and what each round's records
taught, checked against the gold labels of the traffic (which the loop never saw): how many LLM verdicts and
Tier-0 pseudo-labels were wrong.

usage: bench/banking77/loop_report.py LOOP_DIR THETA ROWS0.json ROWS1.json [ROWS2.json]   (the .json beside each .jsonl)
"""
import csv
import json
import math
import sys


def sign_test(a, b):
    n, k = a + b, min(a, b)
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def rows(path):
    return {r["row"]: r for r in (json.loads(l) for l in open(path[: -len(".json")] + ".jsonl") if l.strip())}


d, theta = sys.argv[1], float(sys.argv[2])
files = sys.argv[3:]
base = rows(files[0])
print(f"test rows {len(base)}; θ = {theta}")
for i, f in enumerate(files):
    g = json.load(open(f))
    at = min(g["grid"], key=lambda x: abs(x["theta"] - theta))
    r = rows(f)
    right = lambda x: x["tier0"][0]["label"] == x["gold"]
    up = sum(right(r[k]) and not right(base[k]) for k in base)
    down = sum(right(base[k]) and not right(r[k]) for k in base)
    print(f"head{i}: Tier-0 alone {at['tier0_accuracy']:.4f}; at θ {at['theta']:.2f} escalated {at['escalated_share'] * 100:.1f}%, "
          f"hybrid {at['hybrid_accuracy']:.4f}; against day 0: {up} rows fixed, {down} broken (sign test p = {sign_test(up, down):.3g})")
gold = {r["text"]: r["category"] for r in csv.DictReader(open("/tmp/b77/train.csv", newline=""))}
for n in (1, 2):
    try:
        recs = [json.loads(l) for l in open(f"{d}/rec{n}.jsonl") if l.strip()]
    except FileNotFoundError:
        continue
    by = {}
    for x in recs:
        src = x.get("source", "llm")
        if src == "llm":
            top = x["candidates"][max(range(len(x["fused"])), key=lambda j: x["fused"][j])]
        else:
            top = x.get("label")
        ok = gold.get(x["text"]) == top
        t = by.setdefault(src, [0, 0])
        t[0] += 1
        t[1] += not ok
    print(f"round {n} records: " + ", ".join(f"{s} {t[0]} ({t[1]} wrong, {100 * t[1] / t[0]:.1f}%)" for s, t in sorted(by.items())))
