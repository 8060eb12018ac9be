#!/usr/bin/env python3
"""Issue 31's live run: labelled traffic through a running tiergate server under `mode = "risk"` with audits on,
the audits labelled with the rows' gold labels as an operator would, feedback posted for a share of the
answers, and the traffic drifting half-way (each query keeps a random half of its words: terser users). Prints,
every STEP requests, what the server says: labelled audits, Tier-0's silent error with its 95% Clopper–Pearson
interval, the bound's θ on the head's rows and on the audits, θ in force, and the escalated share.

usage: bench/banking77/drift.py BASE_URL ADMIN_URL TEST_CSV [N_PER_PHASE] [STEP]
(serve first, e.g. scripts/tiergate serve --set 'prefilter.head={kind="trained", dir="/tmp/b77/head-risk"}'
 --set 'routing.mode="risk"' --set routing.max_error=0.05 --set routing.audit_rate=0.5
 --set 'reranker.engine="stub"'; the CSV is split.py's test.csv, read from ../shared, never committed)
"""
import csv
import json
import random
import sys
import urllib.error
import urllib.request

base, admin, test_csv = sys.argv[1], sys.argv[2], sys.argv[3]
n_phase = int(sys.argv[4]) if len(sys.argv) > 4 else 1500
step = int(sys.argv[5]) if len(sys.argv) > 5 else 250
rng = random.Random(31)


def call(url, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if body is not None else "GET"),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


with open(test_csv, newline="") as f:
    rows = [(r["text"], r["category"]) for r in csv.DictReader(f)]
gold_of = {}


def terse(text):
    words = text.split()
    kept = [w for w in words if rng.random() < 0.5] or words[:1]
    return " ".join(kept)


def label_audits():
    status, page, _ = call(f"{admin}/admin/audits?route=classify&limit=1000")
    for item in (page or {}).get("data", []):
        gold = gold_of.get(item.get("text"))
        if gold is not None:
            call(f"{admin}/admin/audits/{item['id']}", {"label": gold})


def report(sent, phase, escalated, answered):
    _, fb, _ = call(f"{admin}/admin/feedback")
    _, routing, _ = call(f"{admin}/admin/routing")
    c = (fb or {}).get("routes", {}).get("classify", {})
    se = c.get("silent_error") or {}
    risk = (routing or {}).get("risk", {}).get("classify", {})
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}%"
    theta_a = risk.get("theta_audits")
    print(f"| {sent} | {phase} | {c.get('audits', {}).get('labelled', 0)} | {pct(se.get('estimate'))} "
          f"({pct(se.get('lower'))}–{pct(se.get('upper'))}) | {risk.get('theta_calibration', 0):.3f} | "
          f"{'–' if theta_a is None else f'{theta_a:.3f}'} | {risk.get('theta', 0):.3f} | "
          f"{pct(escalated / max(answered, 1))} |", flush=True)


print("| requests | traffic | labelled audits | silent error (95% CI) | θ on the head's rows | θ on the audits | "
      "θ in force | escalated (this step) |")
print("|---|---|---|---|---|---|---|---|")
sent = 0
for phase in ("clean", "terse"):
    escalated = answered = 0
    for i in range(n_phase):
        text, gold = rows[rng.randrange(len(rows))]
        if phase == "terse":
            text = terse(text)
        gold_of[text] = gold
        status, body, headers = call(f"{base}/v1/chat/completions",
                                     {"model": "classify", "messages": [{"role": "user", "content": text}]})
        sent += 1
        if status == 200:
            answered += 1
            escalated += headers.get("x-tiergate-tier") == "llm"
            answer = body["choices"][0]["message"]["content"]
            if rng.random() < 0.2:
                call(f"{base}/v1/feedback", {"id": body["id"], "correct": answer == gold})
        if sent % step == 0:
            label_audits()
            report(sent, phase, escalated, answered)
            escalated = answered = 0
