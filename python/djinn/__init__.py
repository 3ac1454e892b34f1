"""djinn: the Python client of djinnd - remote models that feel local.

    import djinn
    client = djinn.connect("127.0.0.1:7070")
    m = client.model("demo")              # a ghost: config, no weights
    for tok in m.generate("NAME\\n", max_new_tokens=20):
        print(tok.text, end="")
    with m.session() as s:
        logits = s.step([0, 5, 9])          # a RemoteTensor, still on the server
        top = logits[:100]                  # only these 100 floats move
        with s.trace([7, 8]) as t:          # inside the forward pass
            h = t.layers[3].output.save()   # after the block: a RemoteTensor (2, hidden)
            t.layers[5].output += steer     # a steering vector (hidden,)

Pure Python over the wire protocol (docs/protocol.md); needs numpy and
msgpack. PyTorch is optional (RemoteTensor.torch(), djinn.hf). See docs/python.md.
"""

from .client import Client, ModelListing, connect
from .errors import (BusyError, ConnectionLost, DeviceError, DjinnError, FormatError, InternalError, InvalidError,
                     NoSpaceError, NotFoundError, OutOfMemoryError, QuotaError, RangeError, UnsupportedError)
from .model import Generation, Model, Session, Token, TokenStream
from .tensor import RemoteTensor
from .trace import Breakpoint, Point, Saved, Trace
from ._version import __version__

__all__ = [
    "connect", "Client", "ModelListing", "Model", "Session", "Token", "TokenStream", "Generation", "RemoteTensor",
    "Trace", "Point", "Saved", "Breakpoint",
    "DjinnError", "ConnectionLost", "InvalidError", "OutOfMemoryError", "FormatError", "UnsupportedError",
    "NotFoundError", "RangeError", "NoSpaceError", "QuotaError", "BusyError", "DeviceError", "InternalError",
]


def __getattr__(name):
    if name == "hf":  # imports torch: only when asked for
        import importlib
        return importlib.import_module(".hf", __name__)
    raise AttributeError("module 'djinn' has no attribute %r" % name)
