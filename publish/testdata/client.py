"""A publisher in Python with the standard library only, as an app would
write one: POST the message (or a batch of them), read the JSON answer. It
prints one JSON line per request: {"name", "status", "retry_after",
"answer"}.

Usage: client.py BASE_URL TOKEN
"""
import json
import sys
import urllib.error
import urllib.request

base, token = sys.argv[1], sys.argv[2]


def publish(name, subject, body, headers, path="/v1/publish/"):
    req = urllib.request.Request(base + path + subject, data=body, method="POST")
    for k, v in headers.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, retry_after, raw = resp.status, resp.headers.get("Retry-After"), resp.read()
    except urllib.error.HTTPError as e:
        status, retry_after, raw = e.code, e.headers.get("Retry-After"), e.read()
    print(json.dumps({"name": name, "status": status, "retry_after": retry_after, "answer": json.loads(raw)}))


auth = {"Authorization": "Bearer " + token}
order = json.dumps({"order": 7, "from": "python"}).encode()
publish("first", "orders.python", order,
        {**auth, "Content-Type": "application/json", "Idempotency-Key": "python-7", "X-Client": "python"})
publish("again", "orders.python", order, {**auth, "Idempotency-Key": "python-7"})
publish("forbidden", "billing.python", b"x", auth)
publish("no-token", "orders.python", b"x", {})
# A batch: two new messages and a retry of the first, each answered.
batch = {"entries": [
    {"entryId": "b1", "idempotencyKey": "python-b1", "contentType": "application/json", "data": {"order": 8}},
    {"entryId": "b2", "idempotencyKey": "python-b2", "dataBase64": "AAE="},
    {"entryId": "retry", "idempotencyKey": "python-7", "data": {"order": 7, "from": "python"}},
]}
publish("batch", "orders.python", json.dumps(batch).encode(), {**auth, "Content-Type": "application/json"},
        path="/v1/publish-batch/")
