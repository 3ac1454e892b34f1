"""sse_events.py: the events of an OpenAI-style server-sent event stream
(djinnd --http with "stream": true), for the bench/ HTTP scripts."""
import json


def sse_events(lines):
    """Each `data: {...}` line of lines (an HTTP response, read line by line)
    as a dict, up to `data: [DONE]`; an error event raises RuntimeError with
    the server's message."""
    for line in lines:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise RuntimeError(ev["error"]["message"])
        yield ev
