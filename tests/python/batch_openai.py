#!/usr/bin/env python3
"""The official `openai` client against tiergate's Batch API, unchanged: files.create, batches.create,
batches.retrieve (polled), files.content, batches.list, batches.cancel. Prints a JSON summary for the Rust test.

Usage: batch_openai.py BASE_URL INPUT_JSONL
"""
import json
import sys
import time

import openai

base, path = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

uploaded = client.files.create(file=open(path, "rb"), purpose="batch")
batch = client.batches.create(
    input_file_id=uploaded.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    metadata={"suite": "batch_openai"},
)
seen_status = [batch.status]
deadline = time.time() + 120
while batch.status not in ("completed", "failed", "cancelled", "expired"):
    if time.time() > deadline:
        sys.exit(f"batch {batch.id} still {batch.status} after 120 s")
    time.sleep(0.2)
    batch = client.batches.retrieve(batch.id)
    if batch.status != seen_status[-1]:
        seen_status.append(batch.status)
if batch.status != "completed":
    sys.exit(f"batch ended {batch.status}: {batch.errors}")
output = client.files.content(batch.output_file_id).text
lines = [json.loads(l) for l in output.splitlines() if l.strip()]

# A second batch, cancelled at once: it ends `cancelled` (its lines before the cancel, if any, kept).
second = client.batches.create(
    input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
)
cancelled = client.batches.cancel(second.id)
deadline = time.time() + 60
while cancelled.status not in ("cancelled", "completed"):
    if time.time() > deadline:
        sys.exit(f"batch {second.id} still {cancelled.status}")
    time.sleep(0.2)
    cancelled = client.batches.retrieve(second.id)

listed = [b.id for b in client.batches.list(limit=10).data]
refused = None
try:
    client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
except openai.BadRequestError as e:
    refused = e.body.get("message") if isinstance(e.body, dict) else str(e)

print(json.dumps({
    "file": {"id": uploaded.id, "bytes": uploaded.bytes, "purpose": uploaded.purpose},
    "batch": {"id": batch.id, "status": batch.status, "statuses": seen_status,
              "counts": batch.request_counts.model_dump(), "metadata": batch.metadata,
              "error_file_id": batch.error_file_id},
    "lines": [{"custom_id": l["custom_id"], "status": l["response"]["status_code"],
               "tier": (l["response"].get("headers") or {}).get("x-tiergate-tier"), "content": l["response"]["body"]["choices"][0]["message"]["content"]}
              for l in lines],
    "cancelled": {"id": second.id, "status": cancelled.status},
    "listed": listed,
    "refused": refused,
}))
