"""The candidate's side of the code-scoring harness: load the program, answer the judge's calls.

Runs inside the sandbox as its own process (``python -I -c <wire + this> REQ_FD RESP_FD``), started by
the judge (:mod:`rlvr.tasks.harness.judge`) with stdin and stdout on ``/dev/null`` and two pipes as
its only channel. It loads ``solution.py`` as the module ``solution`` and then answers requests, one
JSON message each way, framed by a 4-byte big-endian length:

* ``{"op": "get", "name": n}`` — the module's global ``n``: ``{"value": v}`` (plain), ``{"handle": h,
  "type": t, "callable": c}`` (anything else, kept here), or ``{"missing": true}``.
* ``{"op": "call", "target": h, "args": [...], "kwargs": [[k, v], ...]}`` — call object ``h``;
  the answer also carries ``"after"``: the new contents of list, dict, set and bytearray arguments
  (so a test can see an in-place sort).
* ``{"op": "attr", "target": h, "name": a}``, ``{"op": "list", "target": h}``, ``{"op": "len", ...}``.
* Anything the program raises: ``{"raised": type name, "message": text}``.

Nothing here is trusted: the program can patch this code, its own builtins or the wire encoder as it
likes. What it cannot do is reach the judge, which holds the tests and their expected values and
compares the decoded values itself; the program only ever sees the arguments of each call.
"""

import json as _json
import os as _os
import struct as _struct
import sys as _sys
import types as _types

from rlvr.tasks.harness.wire import BadWire, decode, encode  # inlined in the sandbox (see rlvr.tasks.harness)

_MUTABLE = (list, dict, set, bytearray)


def _message(exc):
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a __str__ of the program's that raises
        text = ""
    return text[:300]


def _read(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = _os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def main():
    """Load ``solution.py`` and serve the judge until it closes the request pipe."""
    req, resp = int(_sys.argv[1]), int(_sys.argv[2])
    _sys.argv = ["solution.py"]
    objects = {}

    def keep(obj):
        objects[len(objects) + 1] = obj
        return len(objects)

    def send(msg):
        data = _json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
        data = _struct.pack(">I", len(data)) + data
        while data:
            data = data[_os.write(resp, data):]

    def recv():
        head = _read(req, 4)
        if head is None:
            return None
        body = _read(req, _struct.unpack(">I", head)[0])
        return None if body is None else _json.loads(body)

    def answer(value):
        if value is None or isinstance(value, (bool, int, float, str, bytes, bytearray, complex, list, tuple, dict,
                                                set, frozenset, range)):
            try:
                return {"value": encode(value, keep)}
            except TypeError:  # NotPlain: nested too deeply, e.g. a list holding itself
                pass
        return {"handle": keep(value), "type": type(value).__name__, "callable": callable(value)}

    def serve(msg):
        op = msg["op"]
        if op == "get":
            space = module.__dict__
            return answer(space[msg["name"]]) if msg["name"] in space else {"missing": True}
        target = objects[msg["target"]]
        if op == "call":
            args = [decode(a, objects.__getitem__) for a in msg["args"]]
            kwargs = {k: decode(v, objects.__getitem__) for k, v in msg["kwargs"]}
            out = answer(target(*args, **kwargs))
            out["after"] = [[i, encode(a, keep)] for i, a in enumerate(args) if type(a) in _MUTABLE]
            return out
        if op == "attr":
            return answer(getattr(target, msg["name"]))
        if op == "list":
            return {"value": encode(list(target), keep)}
        if op == "len":
            return {"value": len(target)}
        raise BadWire("unknown op %r" % (op,))

    _sys.path.insert(0, _os.getcwd())
    module = _types.ModuleType("solution")
    module.__file__ = _os.path.abspath("solution.py")
    _sys.modules["solution"] = module
    try:
        with open("solution.py", "rb") as f:
            code = compile(f.read(), "solution.py", "exec")
        exec(code, module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - whatever loading the program raised is its result
        send({"load_error": type(exc).__name__, "message": _message(exc)})
        return
    send({"loaded": True})
    while True:
        msg = recv()
        if msg is None:
            return
        try:
            out = serve(msg)
        except BaseException as exc:  # noqa: BLE001 - the program's exception is the call's result
            out = {"raised": type(exc).__name__, "message": _message(exc)}
        send(out)


if __name__ == "__main__":
    main()
