#!/usr/bin/env python3
"""Replay unlabelled queries through a running `tiergate serve` as traffic (closed loop, CONCURRENCY clients),
then play the operator: label every pending audit item with its gold label from the labelled CSV (the label is
looked up by text; the traffic itself is sent unlabelled). Prints what the traffic got (by tier and channel,
by head version) and what was labelled; writes it as JSON to OUT.

usage: bench/banking77/loop_replay.py URL ADMIN_URL TRAFFIC.jsonl LABELLED.csv OUT.json [CONCURRENCY]
"""
import csv
import json
import sys
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

url, admin, traffic, labelled, out = sys.argv[1:6]
concurrency = int(sys.argv[6]) if len(sys.argv) > 6 else 4
texts = [json.loads(l)["text"] for l in open(traffic) if l.strip()]
gold = {}
with open(labelled, newline="") as f:
    for r in csv.DictReader(f):
        gold[r["text"]] = r["category"]


def post(u, body):
    req = urllib.request.Request(u, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, dict(r.headers), json.loads(r.read() or b"{}")


def ask(text):
    try:
        s, h, _ = post(f"{url}/v1/chat/completions",
                       {"model": "classify", "messages": [{"role": "user", "content": text}]})
        return s, h.get("x-tiergate-tier", ""), h.get("x-tiergate-degraded", ""), h.get("x-tiergate-head-version", "")
    except urllib.error.HTTPError as e:
        return e.code, "", "", ""


with ThreadPoolExecutor(concurrency) as pool:
    got = list(pool.map(ask, texts))
status = Counter(g[0] for g in got)
tiers = Counter((g[1], g[2]) for g in got)
heads = Counter(g[3] for g in got)
labelled_n = wrong = 0
while True:
    with urllib.request.urlopen(f"{admin}/admin/audits?route=classify&limit=1000", timeout=30) as r:
        items = json.loads(r.read())["data"]
    todo = [i for i in items if i.get("text") in gold]
    if not todo:
        break
    for i in todo:
        _, _, v = post(f"{admin}/admin/audits/{i['id']}", {"label": gold[i["text"]]})
        labelled_n += 1
        wrong += bool(v.get("wrong"))
summary = {
    "requests": len(texts),
    "status": dict(status),
    "channels": {f"{t}{'/' + d if d else ''}": n for (t, d), n in tiers.items()},
    "heads": dict(heads),
    "audits_labelled": labelled_n,
    "audits_wrong": wrong,
}
json.dump(summary, open(out, "w"), indent=2)
print(json.dumps(summary))
