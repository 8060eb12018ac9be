#!/usr/bin/env python3
"""Split Banking77's training file (read from ../shared, never copied into the repository) into stratified
train / dev / test CSVs in OUT_DIR: the head is trained on train, the fusion fitted on dev, and
`tiergate eval --hybrid` measured on test, so no figure is measured on rows it was fitted on.

usage: bench/banking77/split.py [SRC_CSV] [OUT_DIR]   (defaults: ../shared/data/banking77/train.csv, /tmp/b77)
"""
import csv
import random
import sys
from collections import defaultdict
from pathlib import Path

src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "shared/data/banking77/train.csv")
out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/b77")
out.mkdir(parents=True, exist_ok=True)
by_label = defaultdict(list)
with src.open(newline="") as f:
    for row in csv.DictReader(f):
        by_label[row["category"]].append(row["text"])
rng = random.Random(7)
parts = {"train": [], "dev": [], "test": []}
for label in sorted(by_label):
    texts = by_label[label]
    rng.shuffle(texts)
    n = len(texts)
    k = max(1, round(0.1 * n))
    parts["test"] += [(t, label) for t in texts[:k]]
    parts["dev"] += [(t, label) for t in texts[k : 2 * k]]
    parts["train"] += [(t, label) for t in texts[2 * k :]]
for name, rows in parts.items():
    with (out / f"{name}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])
        w.writerows(rows)
    print(f"{name}: {len(rows)} rows -> {out / (name + '.csv')}")
