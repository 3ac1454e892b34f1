"""test_balance.py: what a client behind HAProxy sends (djinn.balance, issue 51) - the routing
token in HELLO's request id, the prefix key and headers - and a daemon answering such a HELLO."""

import struct

import pytest

import djinn
from djinn import balance


def test_route_id_has_the_mark_and_is_stable():
    a = balance.route_id("conv-7")
    assert a == balance.route_id(b"conv-7")  # str and its UTF-8 bytes: one key
    assert a >> 63 == 1  # the mark HAProxy's stick rule looks for (byte 23 >= 0x80)
    assert struct.pack("<Q", a)[7] >= 0x80
    assert a != balance.route_id("conv-8")
    assert a < 1 << 64
    for bad in ("", b"", None, 7):
        with pytest.raises(ValueError):
            balance.route_id(bad)


def test_prefix_key_covers_the_first_bytes():
    base = "x" * balance.PREFIX_BYTES
    assert balance.prefix_key(base + "one") == balance.prefix_key(base + "two")  # past the covered bytes
    assert balance.prefix_key("a" + base) != balance.prefix_key("b" + base)
    assert len(balance.prefix_key("hi")) == 16
    assert balance.http_headers() == {}
    h = balance.http_headers(session=42, prefix_of="sys")
    assert h == {"X-Djinn-Session": "42", "X-Djinn-Prefix": balance.prefix_key("sys")}


def test_hello_with_a_routing_token(daemon):
    """The daemon takes the token as any request id; the client's own ids never carry the mark."""
    c = djinn.connect(daemon.addr, route="conv-7")
    try:
        assert c._hello_rid == balance.route_id("conv-7")
        g = c.model("demo").generate("NAME\n  tar - ", max_new_tokens=4, stream=False)
        assert len(g.ids) == 4
        assert c._next_id < 1 << 63
    finally:
        c.close()
