// Verifies requests signed by courier with the Standard Webhooks reference
// library for Node (the standardwebhooks package), as an app would.
// Reads {"secrets": [...], "other": "...", "requests": [{"headers", "body"}]}
// on stdin; writes {"verified": [[bool per secret] per request],
// "other": [bool per request]} on stdout.
"use strict";
const { Webhook } = require("standardwebhooks");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const { secrets, other, requests } = JSON.parse(input);
  const verifies = (secret, r) => {
    try {
      new Webhook(secret).verify(r.body, r.headers, { jsonParse: false });
      return true;
    } catch (e) {
      return false;
    }
  };
  process.stdout.write(JSON.stringify({
    verified: requests.map((r) => secrets.map((s) => verifies(s, r))),
    other: requests.map((r) => verifies(other, r)),
  }));
});
