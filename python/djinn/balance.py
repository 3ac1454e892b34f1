"""balance.py: what a client behind HAProxy sends so the balancer keeps its session where its
KV is and places a prompt where its prefix is cached (deploy/haproxy, docs/deploy.md)."""

import hashlib

# HAProxy's djinn_bin backend sticks on HELLO's request id when its top bit is set.
ROUTE_BIT = 1 << 63
# The prefix key covers the prompt's first bytes: about the first prefix-cache blocks.
PREFIX_BYTES = 256


def route_id(key):
    """HELLO's request id for the routing token key (str or bytes): 64 bits of
    SHA-256(key) with the top bit set. Equal keys, equal ids: a reconnect of the
    same conversation lands on the same daemon (docs/protocol.md, "Behind a balancer")."""
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise ValueError("a routing key is a non-empty str or bytes")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") | ROUTE_BIT


def prefix_key(prompt, nbytes=PREFIX_BYTES):
    """The X-Djinn-Prefix header value for a prompt: hex SHA-256 (16 digits) of its
    first nbytes UTF-8 bytes. For a chat, pass the text of its system message: every
    turn of the conversation and every conversation with that system prompt share it."""
    if isinstance(prompt, str):
        prompt = prompt.encode()
    return hashlib.sha256(bytes(prompt[:nbytes])).hexdigest()[:16]


def http_headers(session=None, prefix_of=None):
    """Headers for one HTTP request: X-Djinn-Session (stick to where the session's
    earlier turns ran) and X-Djinn-Prefix (place a new session by its prompt prefix)."""
    h = {}
    if session is not None:
        h["X-Djinn-Session"] = str(session)
    if prefix_of is not None:
        h["X-Djinn-Prefix"] = prefix_key(prefix_of)
    return h
