#!/usr/bin/env python3
"""Reference receiver for kfpipe's http handler (protocol 1), standard library only.

It checks what docs/handler-protocol.md asks a receiver to check:
  * Kfpipe-Signature: "v1=" + hex HMAC-SHA256(secret, timestamp + "." + body), accepted for
    any secret in KFPIPE_WEBHOOK_SECRETS (comma-separated: old and new during a rotation);
  * Kfpipe-Timestamp within TOLERANCE seconds of now (a captured request cannot be replayed
    later);
  * Idempotency-Key: an effect is applied once per key (a retry after a timeout answers 200
    without applying it again).
Forged, stale or unsigned requests get 401; a request it cannot read gets 400 (permanent for
kfpipe); 2xx finishes the message.

Its 200 answer carries replies for kfpipe to send to the customer, exactly once (protocol 1,
"Replies in the answer"): a text message is echoed back, and "human" hands the session to the
servicer KFPIPE_WEBHOOK_SERVICER. The answer depends only on the message, so a retry with the
same Idempotency-Key gets the same replies, as the protocol asks.

    KFPIPE_WEBHOOK_SECRETS=s1,s2 python3 receiver.py PORT
"""
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE = 300
SECRETS = [s for s in os.environ.get("KFPIPE_WEBHOOK_SECRETS", "").split(",") if s]
SERVICER = os.environ.get("KFPIPE_WEBHOOK_SERVICER", "servicer")
applied = set()


def valid(timestamp, signature, body):
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(time.time() - ts) > TOLERANCE:
        return False
    for secret in SECRETS:
        mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
        if hmac.compare_digest("v1=" + mac.hexdigest(), signature or ""):
            return True
    return False


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not valid(self.headers.get("Kfpipe-Timestamp"), self.headers.get("Kfpipe-Signature"), body):
            self.answer(401, "bad or stale signature")
            return
        try:
            msg = json.loads(body)
        except ValueError:
            self.answer(400, "not JSON")
            return
        key = self.headers.get("Idempotency-Key", "")
        if key not in applied:
            applied.add(key)  # the business effect would happen here, once per key
            print("applied", key, msg.get("msg_type", ""), flush=True)
        self.answer(200, "ok", self.replies(msg))

    @staticmethod
    def replies(msg):
        content = msg.get("content") or {}
        text = (content.get("text") or {}).get("content") if isinstance(content, dict) else None
        if msg.get("msg_type") != "text" or text is None:
            return {}
        if text.strip() == "human":
            return {"replies": [{"msgtype": "text", "text": {"content": "Connecting you to a person."}}],
                    "transfer": {"service_state": 3, "servicer_userid": SERVICER}}
        return {"replies": [{"msgtype": "text", "text": {"content": "You said: " + text}}]}

    def answer(self, code, text, extra=None):
        data = json.dumps(dict(extra or {}, status=text)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("listening", flush=True)
    server.serve_forever()
