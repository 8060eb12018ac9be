#!/usr/bin/env python3
"""At most K rows of each label of a split CSV (text, category), drawn with a seed: the small labelled dev set
a team has on day 0. Reads a split written by split.py (outside the repository), prints CSV.

usage: bench/banking77/per_label.py SPLIT_CSV K [SEED]
"""
import csv
import random
import sys
from collections import defaultdict

src, k = sys.argv[1], int(sys.argv[2])
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 7
by_label = defaultdict(list)
with open(src, newline="") as f:
    for row in csv.DictReader(f):
        by_label[row["category"]].append(row["text"])
rng = random.Random(seed)
w = csv.writer(sys.stdout)
w.writerow(["text", "category"])
for label in sorted(by_label):
    texts = by_label[label]
    rng.shuffle(texts)
    for t in texts[:k]:
        w.writerow([t, label])
