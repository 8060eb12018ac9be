#!/usr/bin/env python3
"""Do label descriptions help the judge? The LLM alone (argmax of its scores over Tier-0's candidates) with
label names only against the same head and rows with descriptions, paired on the `share` most ambiguous rows
of two `eval --hybrid --rows` files: rows only one of them gets right, and a two-sided sign test.

usage: bench/banking77/describe_pair.py NAMES.jsonl DESCRIBED.jsonl [SHARE]
"""
import json
import math
import sys


def load(path):
    return {r["row"]: r for r in (json.loads(l) for l in open(path) if l.strip())}


def llm_right(r):
    s = r["llm_scores"]
    best = max(range(len(s)), key=lambda i: (s[i], -i))
    return r["tier0"][best]["label"] == r["gold"]


def main():
    names, described = load(sys.argv[1]), load(sys.argv[2])
    share = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    rows = sorted(names.values(), key=lambda r: -r["ambiguity"])
    esc = [r["row"] for r in rows[: round(share * len(rows))]]
    a = sum(llm_right(names[i]) for i in esc)
    b = sum(llm_right(described[i]) for i in esc)
    only_d = sum(llm_right(described[i]) and not llm_right(names[i]) for i in esc)
    only_n = sum(llm_right(names[i]) and not llm_right(described[i]) for i in esc)
    n, k = only_d + only_n, min(only_d, only_n)
    p = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
    print(f"{len(esc)} rows: LLM alone names {a / len(esc):.3f}, described {b / len(esc):.3f}; "
          f"only described right {only_d}, only names right {only_n}; sign test p = {p:.3f}")


main()
