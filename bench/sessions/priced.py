#!/usr/bin/env python3
"""Issue 61's replay: multi-turn sessions over a steered route whose two stages are two real llama.cpp servers.

Sessions are built from bench/workloads/bank24.jsonl (the project's labelled bank questions, Banking77 label
names): each session has its own account statement as its system message (~SYSTEM_LINES lines, so every
conversation is a prefix of its own) and TURNS user turns; a turn's question is drawn from the rows whose label
the route maps to the same stage as the previous turn's with probability STICK, else from the other stage's.
Rows are split by position: even rows are `dev`, odd rows `test`; the sessions of a split use only its rows.

  priced.py sessions SPLIT N TURNS SEED            prints N sessions (JSON lines)
  priced.py horizon MAP.toml SESSIONS.jsonl        the mean run of turns a move to another stage serves (dev)
  priced.py run BASE ROUTE SESSIONS.jsonl CONC     replays them, prints one JSON line per turn
  priced.py report MAP.toml TURNS.jsonl [LOG...]   TTFT of later turns, prompt tokens each server evaluated
                                                   (llama.cpp's own count, from its log; without logs, the
                                                   answers' usage: prompt less cached tokens), stage accuracy

The stage a turn should go to is its gold label's stage in MAP.toml (`"*"` for the rest).
"""
import json
import random
import re
import sys
import time
import tomllib
import urllib.request
from concurrent.futures import ThreadPoolExecutor

WORKLOAD = "bench/workloads/bank24.jsonl"
SYSTEM_LINES = 36
STICK = 0.7
MERCHANTS = ["grocer", "pharmacy", "rail", "bakery", "cinema", "garage", "bookshop", "airline", "florist"]


def rows(split):
    every = [json.loads(line) for line in open(WORKLOAD) if line.strip()]
    return [r for i, r in enumerate(every) if (i % 2 == 0) == (split == "dev")]


def stage_map(path):
    m = tomllib.load(open(path, "rb"))["by_label"]
    return lambda label: m.get(label, m["*"])


def statement(rng, i):
    lines = [f"Statement of account {10_000 + i}."]
    for d in range(SYSTEM_LINES):
        lines.append(f"Day {d + 1}: card {rng.randint(1000, 9999)} paid {rng.randint(2, 400)}.{rng.randint(0, 99):02d} "
                     f"EUR to the {rng.choice(MERCHANTS)} number {rng.randint(1, 999)}, reference {rng.randint(10**7, 10**8)}.")
    lines.append("You are the bank's assistant: answer the customer in one or two sentences.")
    return "\n".join(lines)


def sessions(split, n, turns, seed, map_path="bench/steer/map.toml"):
    rng = random.Random(seed)
    stage = stage_map(map_path)
    pool = rows(split)
    by_stage = {}
    for r in pool:
        by_stage.setdefault(stage(r["label"]), []).append(r)
    out = []
    for i in range(n):
        s = rng.choice(sorted(by_stage))
        qs = []
        for _ in range(turns):
            if qs and rng.random() >= STICK:
                s = rng.choice([x for x in sorted(by_stage) if x != s])
            qs.append(rng.choice(by_stage[s]))
        out.append({"id": f"{split}-{seed}-{i}", "system": statement(rng, i), "turns": qs})
    return out


def horizon(map_path, path):
    """Mean length of the run of same-stage turns that starts where a session's gold stage changes."""
    stage = stage_map(map_path)
    runs = []
    for line in open(path):
        st = [stage(t["label"]) for t in json.loads(line)["turns"]]
        for t in range(1, len(st)):
            if st[t] != st[t - 1]:
                k = t
                while k < len(st) and st[k] == st[t]:
                    k += 1
                runs.append(k - t)
    return sum(runs) / len(runs), len(runs)


def replay(base, route, sess):
    messages = [{"role": "system", "content": sess["system"]}]
    out = []
    for t, q in enumerate(sess["turns"]):
        messages.append({"role": "user", "content": q["text"]})
        body = json.dumps({"model": route, "messages": messages, "max_tokens": 24, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        headers = {"content-type": "application/json", "x-session-id": sess["id"],
                   "x-tiergate-deadline-ms": "300000"}
        start = time.perf_counter()
        first, text, h, usage = None, "", {}, {}
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{base}/v1/chat/completions", body, headers),
                                        timeout=600) as r:
                h = {k: r.headers.get(k) for k in ("x-tiergate-stage", "x-tiergate-session", "x-tiergate-switch")}
                for line in r:
                    line = line.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    usage = event.get("usage") or usage
                    ch = event["choices"]
                    if ch and ch[0]["delta"].get("content"):
                        first = first or time.perf_counter() - start
                        text += ch[0]["delta"]["content"]
            ok = True
        except Exception as e:  # a failed turn is counted, not hidden
            ok, h = False, {"error": str(e)}
        out.append({"session": sess["id"], "turn": t, "label": q["label"], "ok": ok,
                    "ttft_ms": None if first is None else round(first * 1e3, 1),
                    "total_ms": round((time.perf_counter() - start) * 1e3, 1),
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"), **h})
        messages.append({"role": "assistant", "content": text or "(no answer)"})
    return out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None


def report(map_path, turns_path, logs):
    stage = stage_map(map_path)
    turns = [json.loads(line) for line in open(turns_path) if line.strip()]
    later = [t["ttft_ms"] for t in turns if t["turn"] > 0 and t["ttft_ms"] is not None]
    right = sum(1 for t in turns if t.get("x-tiergate-stage") == stage(t["label"]))
    evaluated = {}
    if not logs:  # the backend's own count in each answer's usage: what it read, not found cached
        evaluated["usage"] = sum((t.get("prompt_tokens") or 0) - (t.get("cached_tokens") or 0) for t in turns)
    for log in logs:
        n = 0
        for line in open(log, errors="replace"):
            m = re.search(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", line)
            if m:
                n += int(m.group(1))
        evaluated[log] = n
    why = {}
    for t in turns:
        if t.get("x-tiergate-switch"):
            k = t["x-tiergate-switch"].split(";")[0] + "/" + t["x-tiergate-switch"].split("why=")[1].split(";")[0]
            why[k] = why.get(k, 0) + 1
    return {
        "turns": len(turns), "failed": sum(1 for t in turns if not t["ok"]),
        "later_ttft_p50_ms": pct(later, 0.5), "later_ttft_p95_ms": pct(later, 0.95),
        "prompt_tokens_evaluated": sum(evaluated.values()), "by_server": evaluated,
        "right_stage": right, "right_stage_share": round(right / max(len(turns), 1), 3),
        "moves": sum(1 for t in turns if t.get("x-tiergate-session") in ("up", "down")),
        "switch_decisions": why,
    }


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "sessions":
        for s in sessions(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])):
            print(json.dumps(s))
    elif cmd == "horizon":
        h, n = horizon(sys.argv[2], sys.argv[3])
        print(json.dumps({"horizon_turns": round(h, 2), "moves": n}))
    elif cmd == "run":
        base, route, path, conc = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        sess = [json.loads(line) for line in open(path) if line.strip()]
        with ThreadPoolExecutor(conc) as pool:
            for turns in pool.map(lambda s: replay(base, route, s), sess):
                for t in turns:
                    print(json.dumps(t), flush=True)
    elif cmd == "report":
        print(json.dumps(report(sys.argv[2], sys.argv[3], sys.argv[4:])))
