#!/usr/bin/env python3
"""The peer for tiergate's rerank benchmark: the same candidate scoring done by llama.cpp
(llama-cpp-python) on the same GGUF, with its KV cache reused, so both are measured in one run.

  channel    : score_i = mean log P(query | prefix_i); each label prefix evaluated once and its state saved,
               then per rerank: restore each state, evaluate the query, read the logits.
  likelihood : score_i = mean log P(candidate_i | prompt); the prompt evaluated once per rerank, state saved,
               then per candidate: restore, evaluate the candidate text.
Both subtract a content-free prior (computed once, outside the timing) when the config sets one, as
tiergate does.

usage: bench/llamacpp_rerank.py [MODEL.gguf] [--threads N]
Templates: the embedded default config's [reranker.prompts] (read from config/default.toml).
"""
import json
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
from llama_cpp import Llama

root = Path(__file__).resolve().parents[1]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
model = args[0] if args else str(root / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 2
cases = json.loads((root / "bench/rerank_cases.json").read_text())
prompts = tomllib.loads((root / "config/default.toml").read_text())["reranker"]["prompts"]

llm = Llama(model_path=model, n_ctx=1024, n_threads=threads, n_threads_batch=threads, logits_all=True,
            verbose=False)


def tok(text):
    return llm.tokenize(text.encode(), add_bos=False, special=False)


def render(t, **kw):
    for k, v in kw.items():
        t = t.replace("{" + k + "}", v)
    return t


def label_prefix(c):
    ex = "".join(render(prompts["example_line"], example=e) for e in c["examples"][: prompts["max_examples"]])
    return render(prompts["label_prefix"], label=c["label"].replace("_", " "), examples=ex)


def logprob_rows(start, ids):
    """Mean log P(ids) where ids were evaluated at positions start..; logits of position p-1 predict p."""
    rows = np.array(llm.scores[start - 1 : start - 1 + len(ids)], dtype=np.float64)
    rows = rows - rows.max(axis=1, keepdims=True)
    lse = np.log(np.exp(rows).sum(axis=1))
    return float(np.mean([rows[i, t] - lse[i] for i, t in enumerate(ids)]))


def eval_from(state, ids):
    llm.load_state(state)
    start = llm.n_tokens
    llm.eval(ids)
    return logprob_rows(start, ids)


def fresh(ids):
    llm.reset()
    llm.eval(ids)
    return llm.save_state()


def channel(query, states, priors):
    q = tok(render(prompts["query"], query=query))
    return [eval_from(s, q) - p for s, p in zip(states, priors)]


def likelihood(query, cands, priors):
    state = fresh(tok(render(prompts["likelihood_prompt"], query=query)))
    return [eval_from(state, c) - p for c, p in zip(cands, priors)]


cands = cases["candidates"]
t = time.perf_counter()
states = [fresh(tok(label_prefix(c))) for c in cands]
cold_prefix_s = time.perf_counter() - t
lk_cands = [tok(render(prompts["likelihood_candidate"], label=c["label"].replace("_", " "))) for c in cands]
if prompts["content_free"].strip():
    cf = tok(render(prompts["query"], query=prompts["content_free"]))
    ch_priors = [eval_from(s, cf) for s in states]
    lk_state = fresh(tok(render(prompts["likelihood_prompt"], query=prompts["content_free"])))
    lk_priors = [eval_from(lk_state, c) for c in lk_cands]
else:
    ch_priors = [0.0] * len(cands)
    lk_priors = [0.0] * len(cands)

for name, fn, extra in [("channel", channel, (states, ch_priors)), ("likelihood", likelihood, (lk_cands, lk_priors))]:
    times, picks = [], []
    for _ in range(2):
        for q in cases["queries"]:
            t = time.perf_counter()
            s = fn(q, *extra)
            times.append(time.perf_counter() - t)
            picks.append(cands[int(np.argmax(s))]["label"])
    times.sort()
    print(json.dumps({"engine": "llama.cpp", "method": name, "threads": threads, "reranks": len(times),
                      "median_s": round(times[len(times) // 2], 4), "p90_s": round(times[int(len(times) * 0.9)], 4),
                      "cold_prefixes_s": round(cold_prefix_s, 4) if name == "channel" else None,
                      "picks": picks[: len(cases["queries"])]}))
