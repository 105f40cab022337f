"""The judge of the code-scoring harness: holds the tests, runs the candidate in another process.

Runs inside the sandbox as the sandbox's main program, in a fresh interpreter that no candidate code
has touched. In order:

1. Drops the working directory (the one writable place) from ``sys.path`` and makes itself
   non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so a process of the same user cannot read its memory,
   its open files or its environment through ``/proc`` or ``ptrace``. If it cannot, it reports a
   harness failure and runs nothing.
2. Reads the HMAC key and the spec (tests, entry point, limits, the candidate's source) from stdin
   until EOF — before any candidate code exists, so nothing else can read them.
3. Compiles the tests, imports the standard-library modules they name and runs the problem's setup
   code (HumanEval's prompt helpers) and the tests' own code (HumanEval's ``def check``), still
   before the candidate starts.
4. Starts the candidate (:mod:`rlvr.tasks.harness.candidate`) with stdin/stdout on ``/dev/null``, as
   uid 65534 when the judge is root, and talks to it over two pipes. Each name a test uses resolves,
   in order: the entry point → the candidate; a builtin → the judge's own; a standard-library module
   → the judge's import; a name the setup code binds → the judge's (so a program that redefines
   HumanEval/32's ``poly`` to answer 0 does not change the check's); any other name → the
   candidate's global of that name.
5. Evaluates each test here. A call of a candidate function sends only its arguments; what comes back
   is decoded into plain values (:mod:`rlvr.tasks.harness.wire`), so ``==``, ``bool``, ``sorted`` and
   every other operation of the test are the judge's. An object that is not a plain value comes back
   as a handle (:class:`Remote`) that can be called, but refuses comparison and truth tests.
6. Reports each result as one line ``MAC SEQ JSON`` on its stdout, the MAC an HMAC-SHA256 of
   ``SEQ:JSON`` under the key: a line the candidate writes (it can reach the run's stdout pipe through
   bwrap's pid 1) carries no valid MAC and is ignored by the host.

Hidden tests: after the first hidden test has started, no text that came from the candidate (an
exception's message, a returned value's repr, a non-builtin exception type name) is reported, since
the candidate has seen that test's arguments by then.
"""

import ast as _ast
import builtins as _builtins
import hashlib as _hashlib
import hmac as _hmac
import importlib as _importlib
import json as _json
import os as _os
import signal as _signal
import struct as _struct
import subprocess as _subprocess
import sys as _sys

from rlvr.tasks.harness.wire import BadWire, NotPlain, decode, encode  # inlined in the sandbox (see rlvr.tasks.harness)

SANDBOX_UID = 65534
_SKIP_MODULES = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"})


class TestTimeout(BaseException):
    """The test's time ran out (raised by SIGALRM; a BaseException so test code's ``except`` misses it)."""


class CandidateRaised(Exception):
    """The candidate's code raised ``kind`` (its type name) with ``text``."""

    def __init__(self, kind, text):
        super().__init__(text)
        self.kind, self.text = kind, text


class CandidateGone(Exception):
    """The candidate's process ended (or answered nothing readable) in the middle of a call."""


class NotPlainValue(TypeError):
    """A test compared or tested the truth of an object the program returned that is not a plain value."""


class Unsupported(Exception):
    """The test passes a value the wire cannot carry to the program (a function, say): a harness limit."""


def free_names(tree):
    """Names ``tree`` (an ``ast`` node) loads and never binds: what the test needs from outside.

    Interpretation: one flat scope for the whole test (a name bound anywhere in it counts as bound),
    which is exact for assert expressions and close enough for HumanEval's ``def check`` code.
    """
    loaded, bound = set(), set()
    for node in _ast.walk(tree):
        if isinstance(node, _ast.Name):
            (loaded if isinstance(node.ctx, _ast.Load) else bound).add(node.id)
        elif isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, _ast.arg):
            bound.add(node.arg)
        elif isinstance(node, _ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, _ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound


def builtin_exception_name(kind):
    """``kind`` if it names a builtin exception type, else ``"Exception"`` (a type name of the
    program's own choosing could carry text)."""
    obj = getattr(_builtins, kind, None) if isinstance(kind, str) else None
    return kind if isinstance(obj, type) and issubclass(obj, BaseException) else "Exception"


class Candidate:
    """The candidate's process and the request/answer pipes to it."""

    def __init__(self, source, max_bytes):
        req_r, self._req = _os.pipe()
        self._resp, resp_w = _os.pipe()
        user = {}
        if _os.geteuid() == 0:
            user = {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}
        self.proc = _subprocess.Popen(
            [_sys.executable, "-I", "-c", source, str(req_r), str(resp_w)], stdin=_subprocess.DEVNULL,
            stdout=_subprocess.DEVNULL, pass_fds=(req_r, resp_w), close_fds=True, **user)
        _os.close(req_r)
        _os.close(resp_w)
        self.max_bytes = max_bytes

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = _os.read(self._resp, n - len(buf))
            if not chunk:
                raise CandidateGone("the program's process ended")
            buf += chunk
        return buf

    def receive(self):
        """The next message from the candidate (a dict). Raises CandidateGone."""
        (n,) = _struct.unpack(">I", self._read(4))
        if n > self.max_bytes:
            raise CandidateGone("the program answered with more than %d bytes" % self.max_bytes)
        try:
            msg = _json.loads(self._read(n))
        except (ValueError, RecursionError):
            raise CandidateGone("the program's answer is not readable") from None
        if type(msg) is not dict:
            raise CandidateGone("the program's answer is not readable")
        return msg

    def ask(self, msg):
        """Send one request and return the answer. Raises CandidateGone."""
        data = _json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
        data = _struct.pack(">I", len(data)) + data
        try:
            while data:
                data = data[_os.write(self._req, data):]
        except OSError:
            raise CandidateGone("the program's process ended") from None
        return self.receive()

    def kill(self):
        try:
            self.proc.kill()
            self.proc.wait()
        except OSError:
            pass


class Remote:
    """An object that lives in the candidate's process: it can be called, its attributes read, and
    it can be iterated or measured (the candidate materialises it); it refuses ``==``, ordering,
    hashing and truth tests, since its answers would be the program's, not values."""

    __slots__ = ("_judge", "_id", "_type")

    def __init__(self, judge, ident, type_name):
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *args, **kwargs):
        return self._judge.call(self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._judge.value(self._judge.candidate.ask({"op": "attr", "target": self._id, "name": name}))

    def __iter__(self):
        return iter(self._judge.value(self._judge.candidate.ask({"op": "list", "target": self._id})))

    def __len__(self):
        try:
            n = self._judge.value(self._judge.candidate.ask({"op": "len", "target": self._id}))
        except CandidateRaised as exc:  # a TypeError here lets list() fall back to iterating
            raise TypeError("len() of the program's %s object: %s" % (self._type, exc.kind)) from None
        if type(n) is not int or n < 0:
            raise TypeError("len() of the program's object is not a non-negative int")
        return n

    def __repr__(self):
        return "<%s object of the program>" % self._type

    def _refuse(self, *_):
        raise NotPlainValue("the program returned a %s object where the test needs a plain value "
                            "(a number, string, list, tuple, dict, set, ...)" % self._type)

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _refuse


class Judge:
    """Runs one spec's tests against a candidate and reports each result (see the module docstring)."""

    def __init__(self, key, spec):
        self.key, self.spec, self.seq = key, spec, 0
        self.entry = spec.get("entry_point")
        self.candidate = None
        self.hidden_seen = False

    def say(self, **kw):
        """One signed report line on fd 1 (one ``write`` below PIPE_BUF, so it is never split)."""
        body = _json.dumps(kw, separators=(",", ":"), allow_nan=False)
        mac = _hmac.new(self.key, ("%d:%s" % (self.seq, body)).encode(), _hashlib.sha256).hexdigest()
        _os.write(1, ("%s %d %s\n" % (mac, self.seq, body)).encode())
        self.seq += 1

    def value(self, msg):
        """The plain value (or :class:`Remote`) an answer stands for. Raises CandidateRaised/Gone."""
        if "raised" in msg:
            raise CandidateRaised(str(msg["raised"])[:100], str(msg.get("message", ""))[:300])
        if "handle" in msg:
            if type(msg["handle"]) is not int:
                raise CandidateGone("the program's answer is not readable")
            return Remote(self, msg["handle"], str(msg.get("type", "object"))[:60])
        if "value" not in msg:
            raise CandidateGone("the program's answer is not readable")
        try:
            return decode(msg["value"], lambda h: Remote(self, h, "object"))
        except (BadWire, RecursionError) as exc:
            raise CandidateGone("the program's answer is not a plain value: %s" % exc) from None

    def call(self, remote, args, kwargs):
        """Call the candidate's object ``remote`` with the judge's ``args``; copy back in-place changes."""
        def handle(obj):
            if isinstance(obj, Remote):
                return obj._id
            raise Unsupported("a test passes a %s to the program, which the harness cannot send"
                              % type(obj).__name__)
        try:
            wire_args = [encode(a, handle) for a in args]
            wire_kwargs = [[k, encode(v, handle)] for k, v in kwargs.items()]
        except NotPlain as exc:
            raise Unsupported(str(exc)) from None
        msg = self.candidate.ask({"op": "call", "target": remote._id, "args": wire_args, "kwargs": wire_kwargs})
        result = self.value(msg)
        for i, new in msg.get("after") or []:
            if type(i) is int and 0 <= i < len(args):
                self._copy_back(args[i], new)
        return result

    def _copy_back(self, old, data):
        try:
            new = decode(data, lambda h: Remote(self, h, "object"))
        except (BadWire, RecursionError):
            return
        if type(old) is list and type(new) is list or type(old) is bytearray and type(new) is bytearray:
            old[:] = new
        elif type(old) in (dict, set) and type(new) is type(old):
            old.clear()
            old.update(new)

    def namespace(self, trees):
        """The tests' globals before the candidate starts: pristine builtins and stdlib imports."""
        ns = {"__builtins__": _builtins, "__name__": "tests"}
        self.remote_names = {self.entry} - {None}
        stdlib = getattr(_sys, "stdlib_module_names", frozenset())
        for name in set().union(*map(free_names, trees)) if trees else ():
            if name == self.entry:
                continue
            if hasattr(_builtins, name):
                continue
            if name in stdlib and name not in _SKIP_MODULES:
                try:
                    ns[name] = _importlib.import_module(name)
                    continue
                except Exception:  # noqa: BLE001 - then the candidate's global of that name, if any
                    pass
            self.remote_names.add(name)
        return ns

    def bind_remote(self, ns):
        """Bind every name resolved to the candidate; ``False`` (reported) if the entry point is missing."""
        for name in sorted(self.remote_names):
            msg = self.candidate.ask({"op": "get", "name": name})
            if msg.get("missing"):
                if name == self.entry:
                    self.say(i=-1, ok=False, error="NameError", message="no function %r is defined" % name)
                    return False
                continue
            ns[name] = self.value(msg)
            if name == self.entry and not (isinstance(ns[name], Remote) and msg.get("callable")):
                self.say(i=-1, ok=False, error="NameError", message="no function %r is defined" % name)
                return False
        return True

    def fail(self, i, exc):
        """Report test ``i``'s failure by ``exc``, withholding the candidate's text after a hidden test."""
        quiet = self.hidden_seen
        if isinstance(exc, TestTimeout):
            return self.say(i=i, ok=False, error="Timeout", message="")
        if isinstance(exc, Unsupported):
            return self.say(i=i, harness=str(exc))
        if isinstance(exc, CandidateRaised):
            kind = builtin_exception_name(exc.kind)
            return self.say(i=i, ok=False, error=kind, message="" if quiet else exc.text)
        if isinstance(exc, CandidateGone):
            return self.say(i=i, ok=False, error="Exited", message="" if quiet else str(exc))
        if isinstance(exc, NotPlainValue):
            return self.say(i=i, ok=False, error="NotPlainValue", message="" if quiet else str(exc))
        message = "" if quiet or isinstance(exc, AssertionError) else str(exc)[:300]
        return self.say(i=i, ok=False, error=type(exc).__name__, message=message)

    def run_test(self, test, ns):
        """``(ok, got, expected)`` of one test (``got``/``expected`` only for an ``a == b`` test)."""
        if test.get("code") is not None:
            ns["check"](ns[self.entry])
            return True, None, None
        node = test["tree"]
        if isinstance(node, _ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], _ast.Eq):
            got = eval(compile(_ast.Expression(node.left), "test", "eval"), ns)
            exp = eval(compile(_ast.Expression(node.comparators[0]), "test", "eval"), ns)
            return bool(got == exp), got, exp
        return bool(eval(compile(_ast.Expression(node), "test", "eval"), ns)), None, None

    def run(self):
        """Everything after the spec was read: compile, start the candidate, test, report."""
        spec, per_test = self.spec, float(self.spec["per_test_s"])
        tests, setup = spec["tests"], spec.get("setup") or ""
        trees = [_ast.parse(setup)] if setup else []
        for t in tests:
            if t.get("code") is not None:
                trees.append(_ast.parse(t["code"]))
            else:
                t["tree"] = _ast.parse(t["expr"], mode="eval").body
                trees.append(t["tree"])
        ns = self.namespace(trees)
        if setup:
            try:
                exec(compile(setup, "setup", "exec"), ns)
            except Exception as exc:  # noqa: BLE001 - the data set's own code failed: not the program's fault
                return self.say(i=-1, harness="the problem's setup code failed before the program ran: %s: %s"
                                % (type(exc).__name__, str(exc)[:200]))
            self.remote_names = {n for n in self.remote_names if n == self.entry or n not in ns}
        for k, t in enumerate(tests):
            if t.get("code") is not None:
                try:
                    exec(compile(t["code"], "test_%d" % k, "exec"), ns)
                except Exception as exc:  # noqa: BLE001 - the data set's own code failed: not the program's fault
                    return self.say(i=k, harness="test %d's code failed before the program ran: %s: %s"
                                    % (k + 1, type(exc).__name__, str(exc)[:200]))

        _signal.setitimer(_signal.ITIMER_REAL, per_test)
        try:
            self.candidate = Candidate(spec["candidate"], int(spec["max_bytes"]))
            first = self.candidate.receive()
            ready = "load_error" not in first and first.get("loaded") and self.bind_remote(ns)
        except (TestTimeout, CandidateGone, CandidateRaised) as exc:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
            return self.fail(-1, exc)
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        if "load_error" in first:
            return self.say(i=-1, ok=False, error=builtin_exception_name(first["load_error"]),
                            message=str(first.get("message", ""))[:300])
        if not ready:  # no "loaded" (the answer was something else) or no entry point (reported)
            return None
        self.say(loaded=True)
        for i, t in enumerate(tests):
            self.hidden_seen = self.hidden_seen or bool(t.get("hidden"))
            _signal.setitimer(_signal.ITIMER_REAL, per_test)
            try:
                ok, got, exp = self.run_test(t, ns)
            except BaseException as exc:  # noqa: BLE001 - every way a test can fail is reported
                _signal.setitimer(_signal.ITIMER_REAL, 0)
                return self.fail(i, exc)
            _signal.setitimer(_signal.ITIMER_REAL, 0)
            if not ok:
                show = not self.hidden_seen and got is not None
                return self.say(i=i, ok=False, error="AssertionError", message="",
                                got=_short(got) if show else None, expected=_short(exp) if show else None)
            self.say(i=i, ok=True)
        return self.say(done=True)


def _short(v):
    s = repr(v)
    return s if len(s) <= 200 else s[:197] + "..."


def _no_dump():
    """Make this process non-dumpable; ``False`` where that is impossible (no ``prctl``)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001 - no ctypes or no prctl: reported by the caller
        return False


def _alarm(*_):
    raise TestTimeout()


def main():
    """The sandbox's entry point (see the module docstring)."""
    here = _os.path.realpath(_os.getcwd())
    _sys.path[:] = [p for p in _sys.path if p and _os.path.realpath(p) != here]
    protected = _no_dump()
    raw = _sys.stdin.buffer.read()
    _sys.stdin = open(_os.devnull)
    _sys.stdout = _sys.stderr  # the tests' own prints must not reach the report channel
    key_hex, _, body = raw.partition(b"\n")
    judge = Judge(bytes.fromhex(key_hex.decode()), _json.loads(body))
    _signal.signal(_signal.SIGALRM, _alarm)
    if not protected:
        judge.say(i=-1, harness="the judge could not make itself non-dumpable (prctl): its tests would be readable")
    else:
        try:
            judge.run()
        finally:
            if judge.candidate is not None:
                judge.candidate.kill()
    _os._exit(0)


if __name__ == "__main__":
    main()
