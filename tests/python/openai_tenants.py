"""Tenant keys through the official `openai` Python package.

Usage: python3 tests/python/openai_tenants.py BASE_URL GOOD_KEY LIMITED_KEY
GOOD_KEY may use every route; LIMITED_KEY has a request rate of 1 a second with a burst of 1.
Exits non-zero (with the failing assertion) on any mismatch.
"""
import sys
import time

import openai
from openai import OpenAI

base, good, limited = sys.argv[1], sys.argv[2], sys.argv[3]
ask = [{"role": "user", "content": "somebody stole my debit card"}]

# A known key works unchanged.
client = OpenAI(base_url=f"{base}/v1", api_key=good, max_retries=0, timeout=60)
r = client.chat.completions.create(model="classify", messages=ask)
assert r.choices[0].message.content == "lost_or_stolen_card", r.choices[0].message.content

# A wrong key is the client's AuthenticationError, with OpenAI's error code.
wrong = OpenAI(base_url=f"{base}/v1", api_key="sk-not-a-tenant", max_retries=0, timeout=60)
try:
    wrong.chat.completions.create(model="classify", messages=ask)
    raise AssertionError("a wrong key was served")
except openai.AuthenticationError as e:
    assert e.status_code == 401 and e.code == "invalid_api_key", (e.status_code, e.code)

# Over its rate without retries: RateLimitError with rate_limit_exceeded and a Retry-After.
strict = OpenAI(base_url=f"{base}/v1", api_key=limited, max_retries=0, timeout=60)
strict.chat.completions.create(model="classify", messages=ask)
try:
    strict.chat.completions.create(model="classify", messages=ask)
    raise AssertionError("the second request within the burst was served")
except openai.RateLimitError as e:
    assert e.code == "rate_limit_exceeded", e.code
    assert int(e.response.headers["retry-after"]) >= 1, e.response.headers

# With its default retries the client honours Retry-After and gets through.
patient = OpenAI(base_url=f"{base}/v1", api_key=limited, max_retries=3, timeout=60)
t = time.monotonic()
r = patient.chat.completions.create(model="classify", messages=ask)
assert r.choices[0].message.content == "lost_or_stolen_card"
print(f"ok (the retried request took {time.monotonic() - t:.2f} s)")
