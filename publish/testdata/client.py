"""A publisher in Python with the standard library only, as an app would
write one: POST the message, read the JSON answer. It prints one JSON line
per publish: {"name", "status", "retry_after", "answer"}.

Usage: client.py BASE_URL TOKEN
"""
import json
import sys
import urllib.error
import urllib.request

base, token = sys.argv[1], sys.argv[2]


def publish(name, subject, body, headers):
    req = urllib.request.Request(base + "/v1/publish/" + subject, data=body, method="POST")
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
