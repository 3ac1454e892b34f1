"""_wire.py: the djinnd frame format (docs/protocol.md) - the 32-byte header,
message type codes and the msgpack metadata codec. No sockets here."""

import struct

import msgpack

MAGIC = 0x314E4A44  # the bytes "DJN1", little-endian
VERSION = 1
HEADER = struct.Struct("<IHHIIQQ")  # magic, version, type, flags, meta_len, request_id, payload_len
HEADER_BYTES = HEADER.size  # 32
MAX_META = 1 << 20
MAX_REPLY_PAYLOAD = 64 << 30

# Message types (include/djinn/protocol.h, DJ_MSG_TYPE_MAP).
HELLO = 0x01
HEARTBEAT = 0x02
STATS = 0x03
MODEL_LIST = 0x04
MODEL_LOAD = 0x05
MODEL_UNLOAD = 0x06
SESSION_OPEN = 0x07
SESSION_CLOSE = 0x08
GENERATE = 0x09
STEP = 0x0A
FETCH = 0x0B
RELEASE = 0x0C
PAUSE = 0x0D
RESUME = 0x0E
MODEL_INFO = 0x0F
SESSION_ATTACH = 0x10
WEIGHT_HAS = 0x11
WEIGHT_UPLOAD = 0x12
WEIGHT_CHALLENGE = 0x13
WEIGHT_PROVE = 0x14
GRAPH_RUN = 0x15
REPLY = 0x80
TOKEN = 0x81
DONE = 0x82
ERROR = 0x83

FINAL = (REPLY, DONE, ERROR)  # each request gets exactly one of these

# dj_status codes (include/djinn/status.h, DJ_STATUS_MAP): stable on the wire.
STATUS_NAMES = {
    -1: "DJ_EINVAL", -2: "DJ_ENOMEM", -3: "DJ_EIO", -4: "DJ_EFORMAT", -5: "DJ_EUNSUPPORTED",
    -6: "DJ_ENOTFOUND", -7: "DJ_ERANGE", -8: "DJ_ENOSPC", -9: "DJ_EQUOTA", -10: "DJ_EBUSY",
    -11: "DJ_EDEVICE", -12: "DJ_EINTERNAL",
}


def encode_header(msg_type, request_id, meta_len, payload_len):
    return HEADER.pack(MAGIC, VERSION, msg_type, 0, meta_len, request_id, payload_len)


def decode_header(b):
    """(type, request_id, meta_len, payload_len); ValueError on a bad header."""
    magic, version, msg_type, flags, meta_len, request_id, payload_len = HEADER.unpack(b)
    if magic != MAGIC:
        raise ValueError("bad frame magic 0x%08x from djinnd" % magic)
    if version != VERSION:
        raise ValueError("djinnd speaks protocol version %d, this package %d" % (version, VERSION))
    if flags:
        raise ValueError("frame flags 0x%x set" % flags)
    if meta_len > MAX_META or payload_len > MAX_REPLY_PAYLOAD:
        raise ValueError("frame lengths past the limits (meta %d, payload %d)" % (meta_len, payload_len))
    return msg_type, request_id, meta_len, payload_len


def pack_meta(meta):
    return msgpack.packb(meta or {}, use_bin_type=True)


def unpack_meta(b):
    if not b:
        return {}
    m = msgpack.unpackb(bytes(b), raw=False, unicode_errors="replace", strict_map_key=False)
    if not isinstance(m, dict):
        raise ValueError("frame metadata is not a map")
    return m
