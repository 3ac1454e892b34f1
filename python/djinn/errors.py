"""errors.py: djinnd's ERROR frames as Python exceptions - one class per
dj_status name, each carrying the server's status code, name and message."""

from . import _wire


class DjinnError(Exception):
    """An error djinnd answered (or a lost connection). status: the dj_status
    code (negative); name: "DJ_ENOTFOUND"...; message: the server's detail."""

    def __init__(self, status, name, message):
        super().__init__("%s: %s" % (name, message))
        self.status = status
        self.name = name
        self.message = message


class InvalidError(DjinnError): pass           # DJ_EINVAL
class OutOfMemoryError(DjinnError): pass       # DJ_ENOMEM (the server's host memory)
class FormatError(DjinnError): pass            # DJ_EFORMAT
class UnsupportedError(DjinnError): pass       # DJ_EUNSUPPORTED
class NotFoundError(DjinnError, LookupError): pass  # DJ_ENOTFOUND: model, session or handle
class RangeError(DjinnError): pass             # DJ_ERANGE: context full, too long
class NoSpaceError(DjinnError): pass           # DJ_ENOSPC: no pages left
class QuotaError(DjinnError): pass             # DJ_EQUOTA: too many sessions or handles
class BusyError(DjinnError): pass              # DJ_EBUSY: paused or generating
class DeviceError(DjinnError): pass            # DJ_EDEVICE
class InternalError(DjinnError): pass          # DJ_EINTERNAL


class ConnectionLost(DjinnError, ConnectionError):
    """The connection to djinnd closed or broke (DJ_EIO); its sessions and
    handles are gone with it."""

    def __init__(self, message):
        super().__init__(-3, "DJ_EIO", message)


_BY_NAME = {
    "DJ_EINVAL": InvalidError, "DJ_ENOMEM": OutOfMemoryError, "DJ_EIO": DjinnError,
    "DJ_EFORMAT": FormatError, "DJ_EUNSUPPORTED": UnsupportedError, "DJ_ENOTFOUND": NotFoundError,
    "DJ_ERANGE": RangeError, "DJ_ENOSPC": NoSpaceError, "DJ_EQUOTA": QuotaError, "DJ_EBUSY": BusyError,
    "DJ_EDEVICE": DeviceError, "DJ_EINTERNAL": InternalError,
}


def from_meta(meta):
    """The exception for an ERROR frame's metadata."""
    status = meta.get("status", -12)
    if not isinstance(status, int):
        status = -12
    name = meta.get("name") or _wire.STATUS_NAMES.get(status, "DJ_EINTERNAL")
    message = meta.get("message") or ""
    return _BY_NAME.get(name, DjinnError)(status, name, message)
