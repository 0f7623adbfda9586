// A publisher in Node with the standard library only (node:http, and fetch), as an app
// would write one: POST the message (or a batch of them), read the JSON
// answer. It prints one JSON line per request: {"name", "status",
// "retry_after", "answer"}.
//
// Usage: node client.mjs BASE_URL TOKEN
import http from "node:http";

const [base, token] = process.argv.slice(2);

function publish(name, subject, body, headers, path = "/v1/publish/") {
  return new Promise((resolve, reject) => {
    const req = http.request(`${base}${path}${subject}`, { method: "POST", headers }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        console.log(JSON.stringify({
          name, status: res.statusCode, retry_after: res.headers["retry-after"] ?? null,
          answer: JSON.parse(Buffer.concat(chunks).toString()),
        }));
        resolve();
      });
    });
    req.setTimeout(10000, () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end(body);
  });
}

const auth = { Authorization: `Bearer ${token}` };
const order = JSON.stringify({ order: 7, from: "node" });
await publish("first", "orders.node", order,
  { ...auth, "Content-Type": "application/json", "Idempotency-Key": "node-7", "X-Client": "node" });
await publish("again", "orders.node", order, { ...auth, "Idempotency-Key": "node-7" });
await publish("forbidden", "billing.node", "x", auth);
await publish("no-token", "orders.node", "x", {});
// A batch: two new messages and a retry of the first, each answered.
const batch = { entries: [
  { entryId: "b1", idempotencyKey: "node-b1", contentType: "application/json", data: { order: 8 } },
  { entryId: "b2", idempotencyKey: "node-b2", dataBase64: "AAE=" },
  { entryId: "retry", idempotencyKey: "node-7", data: { order: 7, from: "node" } },
] };
await publish("batch", "orders.node", JSON.stringify(batch), { ...auth, "Content-Type": "application/json" },
  "/v1/publish-batch/");
// A publish with fetch, as a server-side app would make it.
const res = await fetch(`${base}/v1/publish/orders.node`, {
  method: "POST", body: order,
  headers: { ...auth, "Content-Type": "application/json", "Idempotency-Key": "node-fetch-7" },
});
console.log(JSON.stringify({
  name: "fetch", status: res.status, retry_after: res.headers.get("retry-after"), answer: await res.json(),
}));
