#!/usr/bin/env python3
"""Routing accuracy of a steered generate route on Banking77 (issue 47): θ chosen on dev, reported on test.

Dev: every dev row through the `classify` route (the same head) gives Tier-0's label and confidence; the
steering rule (a sure label — 1 − p ≤ θ — to its mapped stage, anything else to "*") is applied offline for
θ = 0.00 … 1.00 and the θ with the best routing accuracy is chosen (ties: the larger θ, more to the cheap
stage). Test: that θ is set live on the steered route (`PATCH /admin/routing?route=chat`) and every test row is
sent through it; the stage each response names (`x-tiergate-stage`) is compared with the map's stage for the
row's gold label. Reported with a 95% Wilson interval, beside the share a route that sends everything to
"*" would get right.

usage: steer_report.py BASE ADMIN MAP.toml DEV.csv TEST.csv
"""
import csv
import json
import math
import sys
import tomllib
import urllib.request
from concurrent.futures import ThreadPoolExecutor

base, admin, map_path, dev_path, test_path = sys.argv[1:6]
steer = tomllib.load(open(map_path, "rb"))["by_label"]
default = steer.get("*", "big")


def stage_of(label):
    return steer.get(label, default)


def rows(path):
    with open(path, newline="") as f:
        return [(r["text"], r["category"]) for r in csv.DictReader(f)]


def post(model, text):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4})
    req = urllib.request.Request(f"{base}/v1/chat/completions", body.encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return dict(r.headers), json.load(r)


def classify(row):
    h, v = post("classify", row[0])
    return row[1], v["choices"][0]["message"]["content"], float(h["x-tiergate-confidence"])


def steered(row):
    h, _ = post("chat", row[0])
    return row[1], h["x-tiergate-stage"]


def wilson(k, n, z=1.96):
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    w = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - w, c + w)


def routed(pred, p, theta):
    return steer[pred] if (1 - p) <= theta and pred in steer and pred != "*" else default


with ThreadPoolExecutor(8) as pool:
    dev = list(pool.map(classify, rows(dev_path)))
grid = [i / 100 for i in range(101)]


def on_dev(t):
    """Routing accuracy, cheap share, and the share sent cheap that belongs to "*" (of all rows)."""
    r = [(routed(pred, p, t), stage_of(gold)) for gold, pred, p in dev]
    n = len(r)
    return (sum(a == b for a, b in r) / n, sum(a != default for a, _ in r) / n,
            sum(a != default and b == default for a, b in r) / n)


table = {t: on_dev(t) for t in grid}
print(f"dev: {len(dev)} rows (classify route, same head)")
print("  θ     accuracy  cheap   wrongly cheap")
for t in [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]:
    a, c, w = table[t]
    print(f"  {t:.2f}  {a:.4f}    {c:.4f}  {w:.4f}")
best = max(v[0] for v in table.values())
rules = {
    "best routing accuracy": max(t for t in grid if table[t][0] == best),
    "most cheap with ≤ 0.5% wrongly cheap": max(t for t in grid if table[t][2] <= 0.005),
}


def measure(rule, theta):
    req = urllib.request.Request(f"{admin}/admin/routing?route=chat", json.dumps({"theta_base": theta}).encode(),
                                 {"content-type": "application/json"}, method="PATCH")
    urllib.request.urlopen(req, timeout=10).read()
    test = rows(test_path)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(steered, test))
    n = len(got)
    right = sum(stage == stage_of(gold) for gold, stage in got)
    cheap = sum(stage != default for _, stage in got)
    wrong_cheap = sum(stage != default and stage_of(gold) == default for gold, stage in got)
    lo, hi = wilson(right, n)
    wlo, whi = wilson(wrong_cheap, n)
    print(f"test ({rule}: θ = {theta:.2f} chosen on dev): {n} rows through the steered route")
    print(f"  routing accuracy {right / n:.4f} (95% CI {lo:.4f}–{hi:.4f}); cheap stage {cheap / n:.4f};"
          f" wrongly cheap {wrong_cheap / n:.4f} (95% CI {wlo:.4f}–{whi:.4f})")
    return n, sum(stage_of(gold) == default for gold, _ in got)


for rule, theta in rules.items():
    n, all_default = measure(rule, theta)
print(f"everything to \"*\" would be right on {all_default / n:.4f} of test; the map sends"
      f" {1 - all_default / n:.4f} of the gold labels to the cheap stage")
