#!/usr/bin/env python3
"""Turn a server's escalation records into "perfect LLM" records: each record's fused distribution replaced by
the gold label (one-hot), looked up by text in a labelled CSV. With them `tiergate distill` shows the ceiling
of distillation (what an LLM that is always right would teach Tier-0).

usage: bench/banking77/gold_records.py RECORDS_JSONL LABELLED_CSV OUT_JSONL
"""
import csv
import json
import sys

records, labelled, out = sys.argv[1:4]
gold = {}
with open(labelled, newline="") as f:
    for row in csv.DictReader(f):
        gold[row["text"]] = row["category"]
kept = missed = 0
with open(records) as src, open(out, "w") as dst:
    for line in src:
        r = json.loads(line)
        label = gold.get(r["text"])
        if label is None:
            missed += 1
            continue
        cands = [c for c in r["candidates"] if c != label] + [label]
        r["candidates"] = cands
        r["fused"] = [0.0] * (len(cands) - 1) + [1.0]
        r.pop("tier0", None)
        r.pop("llm", None)
        dst.write(json.dumps(r) + "\n")
        kept += 1
print(f"{kept} records with gold labels ({missed} texts not in {labelled})", file=sys.stderr)
