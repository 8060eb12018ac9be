#!/usr/bin/env python3
"""What a judge gets right and wrong on the escalated rows of an `eval --hybrid --rows` file.

For the `share` most ambiguous rows (default 0.10): Tier-0 alone, the LLM alone, and the fusion
(1 - w) * tier0' + w * softmax(scores / T) (tier0' = Tier-0 renormalised over its candidates, as the server
fuses), with w and T from a head's fusion.json or given; rows fixed / broken against Tier-0, a two-sided sign
test on them, and the gold label's rank among Tier-0's candidates on the rows the fusion still gets wrong.

usage: bench/banking77/rows_report.py ROWS.jsonl (FUSION.json | W T) [SHARE]
"""
import json
import math
import sys


def sign_test(fixed, broken):
    n = fixed + broken
    if n == 0:
        return 1.0
    k = min(fixed, broken)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def softmax(xs, t):
    m = max(xs)
    e = [math.exp((x - m) / t) for x in xs]
    s = sum(e)
    return [v / s for v in e]


def argmax(xs):
    return max(range(len(xs)), key=lambda i: (xs[i], -i))


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    if sys.argv[2].endswith(".json"):
        f = json.load(open(sys.argv[2]))
        w, t, rest = f["llm_weight"], f["llm_temperature"], sys.argv[3:]
    else:
        w, t, rest = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    share = float(rest[0]) if rest else 0.10
    rows.sort(key=lambda r: -r["ambiguity"])
    esc = rows[: round(share * len(rows))]
    assert all(r["llm_scores"] is not None for r in esc), "the file has no LLM scores for some escalated rows"
    t0 = llm = fused = fixed = broken = 0
    gold_rank = {}
    for r in esc:
        labels = [c["label"] for c in r["tier0"]]
        p0 = [c["p"] for c in r["tier0"]]
        s0 = sum(p0)
        p0 = [p / s0 for p in p0]
        pl = softmax(r["llm_scores"], t)
        pf = [(1 - w) * a + w * b for a, b in zip(p0, pl)]
        a, b, c = labels[0] == r["gold"], labels[argmax(pl)] == r["gold"], labels[argmax(pf)] == r["gold"]
        t0 += a
        llm += b
        fused += c
        fixed += (not a) and c
        broken += a and (not c)
        if not c:
            rank = labels.index(r["gold"]) + 1 if r["gold"] in labels else "out"
            gold_rank[rank] = gold_rank.get(rank, 0) + 1
    n = len(esc)
    print(f"{n} escalated rows of {len(rows)} (share {share}); fusion w = {w}, T = {t}")
    print(f"Tier-0 {t0 / n:.3f}  LLM alone {llm / n:.3f}  fused {fused / n:.3f}")
    print(f"fixed {fixed}, broken {broken}: net {fixed - broken:+d} rows = {100 * (fixed - broken) / len(rows):+.2f} points overall; sign test p = {sign_test(fixed, broken):.3f}")
    print(f"where the fusion is wrong, the gold label's rank among Tier-0's candidates: {dict(sorted(gold_rank.items(), key=str))}")


main()
