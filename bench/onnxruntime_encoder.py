#!/usr/bin/env python3
"""The peer for Tier-0's encoder: all-MiniLM-L6-v2 on onnxruntime, fp32 and dynamic int8, on the same texts,
the same tokenizer (the model folder's tokenizer.json, truncated at 64 tokens as tiergate is) and the same
thread count, so both are measured in one run (bench/encoder_peers.sh).

The ONNX graph comes from bench/fetch-onnx-minilm.sh (an export with int8 weights that onnxruntime folds
back to fp32); here it is turned into the fp32 graph (constant folding, saved once) and that into the
MatMulInteger graph users run (onnxruntime.quantization.quantize_dynamic, saved once). Pooling: masked mean
and L2 normalisation, as sentence-transformers does, inside the timing.

usage: bench/onnxruntime_encoder.py TEXTS_FILE [--threads 2] [--onnx models/minilm-onnx/model.onnx]
       [--tokenizer models/all-MiniLM-L6-v2/tokenizer.json]
Prints one JSON object per precision, and the int8 vectors' cosine to fp32.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

root = Path(__file__).resolve().parents[1]


def opt(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


texts_file = sys.argv[1]
threads = int(opt("--threads", "2"))
source = Path(opt("--onnx", str(root / "models/minilm-onnx/model.onnx")))
tok = Tokenizer.from_file(opt("--tokenizer", str(root / "models/all-MiniLM-L6-v2/tokenizer.json")))
tok.enable_truncation(64)
tok.no_padding()
texts = [l.strip() for l in open(texts_file) if l.strip()]


def session(path, threads, save=None, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = level
    if save:
        so.optimized_model_filepath = str(save)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


fp32 = source.with_name("model-fp32.onnx")
int8 = source.with_name("model-int8-dynamic.onnx")
if not fp32.exists():
    session(source, 1, save=fp32, level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
if not int8.exists():
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)


def feed(batch):
    enc = tok.encode_batch(batch)
    n = max(len(e.ids) for e in enc)
    ids = np.zeros((len(enc), n), np.int64)
    mask = np.zeros((len(enc), n), np.int64)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def embed(sess, batch):
    f = feed(batch)
    h = sess.run(None, f)[0]
    m = f["attention_mask"][..., None].astype(np.float32)
    v = (h * m).sum(1) / m.sum(1)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


vectors = {}
for name, path in [("fp32", fp32), ("int8_dynamic", int8)]:
    s = session(path, threads)
    for t in texts[:20]:
        embed(s, [t])
    calls = max(len(texts), 300)
    ms = []
    for i in range(calls):
        t = time.perf_counter()
        embed(s, [texts[i % len(texts)]])
        ms.append((time.perf_counter() - t) * 1e3)
    ms.sort()
    reps = max(2000 // len(texts), 1)
    t = time.perf_counter()
    for _ in range(reps):
        for i in range(0, len(texts), 16):
            embed(s, texts[i : i + 16])
    seq_s = reps * len(texts) / (time.perf_counter() - t)
    vectors[name] = np.concatenate([embed(s, texts[i : i + 16]) for i in range(0, len(texts), 16)])
    print(json.dumps({
        "engine": "onnxruntime " + ort.__version__,
        "precision": name,
        "threads": threads,
        "texts": len(texts),
        "mean_tokens": float(np.mean([len(e.ids) for e in tok.encode_batch(texts)])),
        "batch1_ms_p50": ms[len(ms) // 2],
        "batch1_ms_p95": ms[len(ms) * 95 // 100],
        "batch16_seq_s": seq_s,
    }))
cos = (vectors["fp32"] * vectors["int8_dynamic"]).sum(1)
print(json.dumps({"int8_dynamic_cosine_to_fp32": {"min": float(cos.min()), "mean": float(cos.mean())}}))
