#!/usr/bin/env python3
"""A cascade against each single-LLM hybrid at the same LLM seconds (issue 24's demonstration).

Inputs are `tiergate eval --hybrid --json` outputs over the same rows:
  CASCADE_DEV, CASCADE_TEST : `--from-rows SMALL --stage-rows BIG` (a head with the small judge's fusion.json
                              and the big judge's fusion.STAGE.json), on dev and on test
  SMALL_TEST, BIG_TEST      : `--from-rows SMALL` / `--from-rows BIG` alone (each with a head holding its own
                              first-stage fit), on test
For each budget (LLM seconds per row over all rows: what each single hybrid spends at 5, 10, 20 and 30%
escalation), the cascade point (first-stage share, second-stage θ) is chosen on dev as the most accurate within
the budget, then reported on test beside each single hybrid interpolated at the same spend. Rows fixed and
broken are not in these JSONs: the accuracy difference's noise is about one row in n (0.1 point per row on
1,003 rows).

usage: bench/banking77/cascade_report.py CASCADE_DEV CASCADE_TEST SMALL_TEST BIG_TEST
"""
import json
import sys


def spend_curve(report):
    """(LLM s per row, hybrid accuracy) per θ of a single-LLM report, ascending in spend."""
    pts = [(0.0, report["grid"][0]["tier0_accuracy"])]
    for g in report["grid"]:
        if g["llm_seconds_per_escalation"] is None:
            continue
        pts.append((g["escalated_share"] * g["llm_seconds_per_escalation"], g["hybrid_accuracy"]))
    return sorted(set(pts))


def at_spend(curve, s):
    """Accuracy interpolated at spend `s` (None beyond the curve's largest spend)."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= s <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (s - x0) / (x1 - x0)
    return curve[0][1] if s <= curve[0][0] else None


def spend_at_share(report, share):
    best = min(report["grid"], key=lambda g: abs(g["escalated_share"] - share))
    return best["escalated_share"] * (best["llm_seconds_per_escalation"] or 0.0), best["escalated_share"]


def main():
    cdev, ctest, small, big = (json.load(open(p)) for p in sys.argv[1:5])
    key = lambda p: (p["first_share"], p["second_theta"])
    test_by = {key(p): p for p in ctest["cascade"]}
    small_c, big_c = spend_curve(small), spend_curve(big)
    print(f"test: {ctest['n']} rows, Tier-0 {ctest['tier0_accuracy']:.4f}; stages {ctest['llms'][0]} → {ctest['llms'][1]}")
    print(f"fusions: {ctest['fusions']} ({', '.join(ctest['fusion_sources'])})")
    print()
    print("| budget (LLM s / row) | cascade point (dev-chosen) | cascade, test | small alone, test | big alone, test | stage-1 / stage-2 rows (test) |")
    print("|---|---|---|---|---|---|")
    for who, rep in (("small", small), ("big", big)):
        for share in (0.05, 0.1, 0.2, 0.3):
            budget, real = spend_at_share(rep, share)
            fits = [p for p in cdev["cascade"] if p["llm_seconds_per_row"] <= budget + 1e-9]
            if not fits:
                continue
            chosen = max(fits, key=lambda p: (p["accuracy"], -p["llm_seconds_per_row"]))
            t = test_by.get(key(chosen))
            if t is None:
                continue
            a_small, a_big = at_spend(small_c, t["llm_seconds_per_row"]), at_spend(big_c, t["llm_seconds_per_row"])
            fmt = lambda a: "-" if a is None else f"{a:.4f}"
            print(
                f"| {budget:.3f} ({who} at {real:.0%}) | share {chosen['first_share']:.2f}, θ2 {chosen['second_theta']:.2f} "
                f"| {t['accuracy']:.4f} ({t['llm_seconds_per_row']:.3f} s) | {fmt(a_small)} | {fmt(a_big)} "
                f"| {t['first_rows']} / {t['second_rows']} |"
            )


if __name__ == "__main__":
    main()
