#!/usr/bin/env python3
"""Replays ten-turn sessions against a generate route whose stage has two alternatives, and counts the turns
that switch backend: a turn whose backend (`x-tiergate-backend`) differs from its session's previous turn's,
while no response failed (a pin moves only when its backend cannot take the turn; here none fails).

Each session sends `x-session-id`; the conversation grows turn by turn (every earlier user and assistant turn
is sent again, as a chat client does). Sessions run CONCURRENCY at a time.

usage: replay.py BASE ROUTE SESSIONS TURNS CONCURRENCY [--no-session-header]
"""
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

base, route = sys.argv[1], sys.argv[2]
sessions, turns, concurrency = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
send_key = "--no-session-header" not in sys.argv
QUESTIONS = ["where is my card", "it was sent last week", "can you check again", "what about the fee",
             "and the exchange rate", "ok thanks", "one more thing", "my pin is blocked", "how do i reset it",
             "great"]


def session(i):
    messages, backends, ttfts, failed = [], [], [], 0
    for t in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
        body = json.dumps({"model": route, "messages": messages, "max_tokens": 8, "stream": True}).encode()
        headers = {"content-type": "application/json"}
        if send_key:
            headers["x-session-id"] = f"replay-{i}"
        req = urllib.request.Request(f"{base}/v1/chat/completions", body, headers)
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                backend = r.headers.get("x-tiergate-backend")
                text, first = "", None
                for line in r:
                    line = line.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    delta = json.loads(line[6:])["choices"]
                    if delta and delta[0]["delta"].get("content"):
                        first = first or time.perf_counter() - start
                        text += delta[0]["delta"]["content"]
        except Exception:
            failed += 1
            backends.append(None)
            continue
        backends.append(backend)
        ttfts.append((t, first))
        messages.append({"role": "assistant", "content": text})
    return backends, ttfts, failed


t0 = time.perf_counter()
with ThreadPoolExecutor(concurrency) as pool:
    results = list(pool.map(session, range(sessions)))
took = time.perf_counter() - t0
switches = later = failed = 0
for backends, _, f in results:
    failed += f
    for a, b in zip(backends, backends[1:]):
        if a is None or b is None:
            continue
        later += 1
        switches += a != b
by_turn = {}
for _, ttfts, _ in results:
    for t, first in ttfts:
        if first:
            by_turn.setdefault(t, []).append(first)
print(json.dumps({
    "sessions": sessions, "turns": turns, "failed": failed, "later_turns": later, "switches": switches,
    "switch_share": switches / max(later, 1), "seconds": round(took, 1),
    "ttft_by_turn_ms": {str(t): round(1e3 * sorted(xs)[len(xs) // 2], 1) for t, xs in sorted(by_turn.items())},
}))
