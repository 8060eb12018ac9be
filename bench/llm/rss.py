"""The worker's memory over many distinct generations (docs/benchmarks.md, "Memory over 500 generations"):
N streamed chat completions on the `generate` route, each prompt opening with its own nonce (so each is a new
prefix for the prefix cache), STREAMS at a time; the worker's RSS (VmRSS of the `tiergate-reranker` process) is
read before the first and after every EVERY generations.

usage: rss.py URL WORKER_PID [--n 500] [--streams 4] [--every 50] [--max-tokens 48]
"""

import argparse
import json
import threading
import urllib.request
import uuid


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def one(url: str, max_tokens: int) -> None:
    topic = uuid.uuid4().hex
    body = json.dumps({"model": "generate", "max_tokens": max_tokens, "stream": True, "temperature": 0.7,
                       "messages": [{"role": "user", "content": f"Request {topic}: write about {topic[:6]} and banks."}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        for _ in r:
            pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("pid", type=int)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    print(f"generations 0: RSS {rss_mib(a.pid):.1f} MiB", flush=True)
    done = 0
    lock = threading.Lock()
    failed = []

    def worker():
        nonlocal done
        while True:
            with lock:
                if done >= a.n:
                    return
                done += 1
                k = done
            try:
                one(a.url, a.max_tokens)
            except Exception as e:  # noqa: BLE001 - counted and printed, never hidden
                failed.append(str(e)[:120])
            if k % a.every == 0:
                print(f"generations {k}: RSS {rss_mib(a.pid):.1f} MiB", flush=True)

    ts = [threading.Thread(target=worker) for _ in range(a.streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"failed: {len(failed)} {failed[:2]}")


if __name__ == "__main__":
    main()
