"""A paired generation benchmark: streamed chat completions against several OpenAI-compatible servers in one
run, cell by cell (prompt size x concurrent streams), each server's cell run right after the others' so a
noisy minute hits them alike. Each request's prompt starts with its own nonce, so no server reuses a cached
prefix from an earlier request. Per cell and server: TTFT p50, prompt tokens/s (prompt tokens / TTFT), per-stream
decode tokens/s (tokens after the first / time since the first), whole-request p50, the aggregate tokens/s of
the cell (all generated tokens / the cell's wall time, prefills included), and the batched decode rate: content
events of all streams while every stream of a round is decoding (from the last stream's first token to the first
stream's last) / that window (llama.cpp's batched-bench calls it S_TG; "–" when the window is empty).

usage: engines.py --target NAME=URL=MODEL ... [--prompts 130,4000] [--streams 1,4,16] [--requests N]
       [--max-tokens 48] [--skip NAME:PROMPT:STREAMS ...]
       (NAME:PROMPT:* or NAME:*:STREAMS skip a row or a column)   (bench/llm/engines.sh starts the servers)
"""

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
import uuid

FILLER = (
    "The quarterly report covers revenue, costs, hiring and the roadmap. Revenue grew in every region, "
    "costs stayed flat, two teams hired, and the roadmap moved the search work to the next quarter. "
)


def prompt_of(tokens: int) -> str:
    """About `tokens` tokens of text (about 4.3 characters a token on these tokenizers), then a question."""
    chars = max(0, tokens * 43 // 10 - 120)
    body = (FILLER * (chars // len(FILLER) + 1))[:chars]
    return f"Request {uuid.uuid4().hex}.\n{body}\nIn one sentence, what does the report say about revenue?"


def one(url: str, model: str, prompt: str, max_tokens: int, out: list, timeout: float):
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    req = urllib.request.Request(
        url + "/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    t0 = time.monotonic()
    first = last = None
    chunks = 0
    times = []
    usage = None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                v = json.loads(line[6:])
                if v.get("usage"):
                    usage = v["usage"]
                for c in v.get("choices") or []:
                    if (c.get("delta") or {}).get("content"):
                        now = time.monotonic()
                        first = first or now
                        last = now
                        chunks += 1
                        times.append(now)
    except Exception as e:  # noqa: BLE001 - a failed request is reported, never hidden
        out.append({"error": str(e)[:200]})
        return
    end = time.monotonic()
    if first is None:
        out.append({"error": "no text"})
        return
    completion = (usage or {}).get("completion_tokens") or chunks
    prompt_tokens = (usage or {}).get("prompt_tokens")
    out.append(
        {
            "ttft": first - t0,
            "whole": end - t0,
            "completion": completion,
            "prompt_tokens": prompt_tokens,
            "decode": (completion - 1) / (last - first) if last > first and completion > 1 else None,
            "times": times,
        }
    )


def batched(round_results):
    """(events, seconds) while every stream of one round decodes: from the last first token to the first last."""
    ok = [r for r in round_results if "error" not in r and len(r["times"]) > 1]
    if len(ok) < len(round_results) or not ok:
        return 0, 0.0
    a = max(r["times"][0] for r in ok)
    b = min(r["times"][-1] for r in ok)
    if b <= a:
        return 0, 0.0
    return sum(sum(1 for t in r["times"] if a < t <= b) for r in ok), b - a


def cell(url, model, prompt_tokens, streams, requests, max_tokens, timeout, known=None):
    results: list = []
    t0 = time.monotonic()
    done = 0
    events = seconds = 0
    while done < requests:
        batch = min(streams, requests - done)
        start = len(results)
        threads = [
            threading.Thread(
                target=one, args=(url, model, prompt_of(prompt_tokens), max_tokens, results, timeout)
            )
            for _ in range(batch)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        e, w = batched(results[start:])
        events, seconds = events + e, seconds + w
        done += batch
    wall = time.monotonic() - t0
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    if not ok:
        return {"errors": errors}
    p50 = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    decode = [r["decode"] for r in ok if r["decode"]]
    for r in ok:
        r["prompt_tokens"] = r["prompt_tokens"] or known
    pt = [r["prompt_tokens"] / r["ttft"] for r in ok if r["prompt_tokens"]]
    return {
        "n": len(ok),
        "errors": errors,
        "prompt_tokens": p50([r["prompt_tokens"] for r in ok if r["prompt_tokens"]]),
        "ttft_p50": p50([r["ttft"] for r in ok]),
        "prompt_tps": p50(pt),
        "decode_tps": p50(decode),
        "whole_p50": p50([r["whole"] for r in ok]),
        "aggregate_decode_tps": sum(r["completion"] for r in ok) / wall,
        "batched_decode_tps": events / seconds if seconds > 0 else None,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", action="append", required=True, help="NAME=URL=MODEL")
    ap.add_argument("--prompts", default="130,4000")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--requests", type=int, default=0, help="per cell (0: max(3, streams))")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--skip", action="append", default=[], help="NAME:PROMPT:STREAMS or NAME:PROMPT:*")
    a = ap.parse_args()
    targets = [t.split("=", 2) for t in a.target]
    print("| prompt | streams | server | n | prompt tok | TTFT p50 s | prompt tok/s | decode tok/s (stream) "
          "| whole p50 s | aggregate tok/s | batched decode tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in [int(x) for x in a.prompts.split(",")]:
        for s in [int(x) for x in a.streams.split(",")]:
            known = None  # a server that sends no usage (llama-cpp-python) is credited the others' prompt count
            for name, url, model in targets:
                if {f"{name}:{p}:{s}", f"{name}:{p}:*", f"{name}:*:{s}"} & set(a.skip):
                    continue
                n = a.requests or max(3, s)
                r = cell(url, model, p, s, n, a.max_tokens, a.timeout, known)
                if r.get("prompt_tokens") == r.get("prompt_tokens"):  # not NaN
                    known = r.get("prompt_tokens", known)
                if "n" not in r:
                    print(f"| {p} | {s} | {name} | 0 | – | – | – | – | – | – | – (errors: {r['errors'][:2]}) |")
                    continue
                err = f" ({len(r['errors'])} failed: {r['errors'][:1]})" if r["errors"] else ""
                b = r["batched_decode_tps"]
                print(
                    f"| {p} | {s} | {name} | {r['n']} | {r['prompt_tokens']:.0f} | {r['ttft_p50']:.2f} | "
                    f"{r['prompt_tps']:.0f} | {r['decode_tps']:.1f} | {r['whole_p50']:.2f} | "
                    f"{r['aggregate_decode_tps']:.1f} | {'–' if b is None else f'{b:.1f}'}{err} |"
                )
                sys.stdout.flush()


if __name__ == "__main__":
    main()
