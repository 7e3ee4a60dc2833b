"""Verifies Standard Webhooks signatures independently of Keel's Rust code.

Reads a JSON list of {secret, id, timestamp, signature, body} from stdin and prints
{"impl": ..., "ok": [bool, ...]}. Uses the reference `standardwebhooks` package
(PyPI) when it is importable; otherwise a from-spec verifier on the standard library
(HMAC-SHA256 over "id.timestamp.body" with the base64 key after "whsec_", any of the
space-separated "v1,<base64>" signatures may match).
"""
import base64
import hashlib
import hmac
import json
import sys

items = json.load(sys.stdin)

try:
    from standardwebhooks.webhooks import Webhook

    def verify(it):
        try:
            Webhook(it["secret"]).verify(
                it["body"],
                {
                    "webhook-id": it["id"],
                    "webhook-timestamp": it["timestamp"],
                    "webhook-signature": it["signature"],
                },
            )
            return True
        except Exception:
            return False

    impl = "standardwebhooks"
except ImportError:

    def verify(it):
        secret = it["secret"]
        if secret.startswith("whsec_"):
            secret = secret[len("whsec_"):]
        key = base64.b64decode(secret)
        signed = f'{it["id"]}.{it["timestamp"]}.{it["body"]}'.encode()
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for part in it["signature"].split(" "):
            version, _, sig = part.partition(",")
            if version == "v1" and hmac.compare_digest(sig, expected):
                return True
        return False

    impl = "stdlib"

print(json.dumps({"impl": impl, "ok": [verify(i) for i in items]}))
