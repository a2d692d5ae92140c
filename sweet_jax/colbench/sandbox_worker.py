"""The process that runs one piece of untrusted code inside the sandbox, and the plain-data codec for its results.

Run as a standalone script (`python -S -s -P sandbox_worker.py`, no package imports, so it starts fast) by
`colbench.sandbox`. It reads one job from stdin, marshalled (`marshal`, which needs no import):

    {"code": str, "calls": [str, ...], "start": int, "namespace": "official" | "clean", "timeout": float | null,
     "limits": {"as_bytes": int, "cpu_s": int, "nofile": int, "fsize": int, "nproc": int}, "no_fork": bool,
     "path": [str, ...]}

puts `path` (the interpreter's site-packages, which `site` would have added) on its module search path,
sets hard resource limits on itself, with `no_fork` installs a seccomp filter that refuses to create processes
(threads still work), writes `ready`, then for each call from `start` on runs the code afresh and evaluates the call
(the official per-test semantics, SIGALRM timeout included) and writes one line `"<index>\\t<encoded value>\\n"` to
the pipe whose fd number the job names (`"fd"`). Exceptions and timeouts are encoded as null (the official `None`).

The worker reports values, never verdicts: the evaluator compares them outside the sandbox, after `decode` rebuilt
them from plain builtin, numpy, datetime and decimal types. So nothing the untrusted code defines (a class with an
always-true `__eq__`, a subclass of int, a poisoned builtin) reaches the comparison, and code that forges its own
result lines only claims values it could have returned anyway.
"""

from __future__ import annotations

import _signal
import builtins
import marshal
import os
import sys
from _json import encode_basestring_ascii

MAX_NODES = 200_000  # values bigger than this (or deeper than MAX_DEPTH) are "too large": the test fails
MAX_CHARS = 4_000_000
MAX_DEPTH = 100


class TooLarge(Exception):
    pass


# ------------------------------------------------------------------------------------------------ codec
def encode(value):
    """A JSON-able tagged tree of `value`, built with the base types' own methods (overrides are never called)."""
    return _Encoder().enc(value, 0)


_NO = object()  # a part of the encoder that does not handle the value


class _Encoder:
    """`encode` within a budget of nodes and characters (`TooLarge` past it, or past MAX_DEPTH)."""

    def __init__(self):
        self.nodes, self.chars = MAX_NODES, MAX_CHARS

    def spend(self, nodes: int = 0, chars: int = 0) -> None:
        self.nodes -= nodes
        self.chars -= chars
        if self.nodes < 0 or self.chars < 0:
            raise TooLarge()

    def enc(self, x, depth: int):
        self.spend(nodes=1)
        if depth > MAX_DEPTH:
            raise TooLarge()
        if x is None or type(x) is bool:
            return x
        np = sys.modules.get("numpy")
        if np is not None and isinstance(x, (np.ndarray, np.generic)):
            return self._numpy(np, x, depth)
        for part in (self._number_or_text, self._container, self._stdlib):
            out = part(x, depth)
            if out is not _NO:
                return out
        return ["opaque", f"{type(x).__module__}.{type(x).__qualname__}"]

    def _numpy(self, np, x, depth: int):
        if isinstance(x, np.ndarray):
            arr = np.asarray(x)
            if arr.dtype.kind in "biufc":
                self.spend(nodes=arr.size)
                flat = [self.enc(v, depth + 1) for v in arr.ravel().tolist()]
                return ["ndarray", arr.dtype.str, list(arr.shape), flat]
            if arr.dtype.kind in "OUS":
                return ["ndarray", "O" if arr.dtype.kind == "O" else arr.dtype.str, list(arr.shape),
                        [self.enc(v, depth + 1) for v in arr.ravel().tolist()]]
            return ["opaque", f"numpy.ndarray[{arr.dtype.str}]"]
        if x.dtype.kind in "biufc":
            return ["npscalar", x.dtype.str, self.enc(x.item(), depth + 1)]
        return ["opaque", f"numpy.{type(x).__name__}"]

    def _number_or_text(self, x, depth: int):
        if isinstance(x, int):
            return ["int", int.__repr__(int.__add__(x, 0))]
        if isinstance(x, float):
            return ["float", float.__repr__(float.__add__(x, 0.0))]
        if isinstance(x, complex):
            c = complex.__add__(x, 0j)
            return ["complex", float.__repr__(c.real), float.__repr__(c.imag)]
        if isinstance(x, str):
            s = str.__getitem__(x, slice(None))
            self.spend(chars=len(s))
            return ["str", s]
        if isinstance(x, (bytes, bytearray)):
            b = bytes(bytes.__getitem__(x, slice(None))) if isinstance(x, bytes) else bytes(bytearray.copy(x))
            self.spend(chars=2 * len(b))
            return ["bytes" if isinstance(x, bytes) else "bytearray", b.hex()]
        return _NO

    def _container(self, x, depth: int):
        if isinstance(x, list):
            return ["list", [self.enc(v, depth + 1) for v in list.__iter__(x)]]
        if isinstance(x, tuple):
            return ["tuple", [self.enc(v, depth + 1) for v in tuple.__iter__(x)]]
        if isinstance(x, dict):
            return ["dict", [[self.enc(k, depth + 1), self.enc(v, depth + 1)] for k, v in dict.items(x)]]
        if isinstance(x, frozenset):
            return ["frozenset", [self.enc(v, depth + 1) for v in frozenset.__iter__(x)]]
        if isinstance(x, set):
            return ["set", [self.enc(v, depth + 1) for v in set.__iter__(x)]]
        if isinstance(x, range):
            return ["range", range.start.__get__(x), range.stop.__get__(x), range.step.__get__(x)]
        return _NO

    def _stdlib(self, x, depth: int):
        # A value of these types exists only once their module is loaded: the worker imports none of them up front.
        datetime, decimal, fractions = (_loaded(*names) for names in _STDLIB)
        # datetime before date: datetime subclasses date.
        if datetime and isinstance(x, datetime.datetime) and x.tzinfo is None:
            return ["datetime", datetime.datetime.isoformat(x)]
        if datetime and isinstance(x, datetime.date) and not isinstance(x, datetime.datetime):
            return ["date", datetime.date.isoformat(x)]
        if datetime and isinstance(x, datetime.time) and x.tzinfo is None:
            return ["time", datetime.time.isoformat(x)]
        if datetime and isinstance(x, datetime.timedelta):
            return ["timedelta", x.days, x.seconds, x.microseconds]
        if decimal and isinstance(x, decimal.Decimal):
            return ["decimal", decimal.Decimal.__str__(x)]
        if fractions and isinstance(x, fractions.Fraction):
            return ["fraction", str(int(x.numerator)), str(int(x.denominator))]
        if isinstance(x, type):
            mod, name = type.__getattribute__(x, "__module__"), type.__getattribute__(x, "__qualname__")
            # Only a class importable by name is the same object on both sides; an exec-defined class never is.
            if isinstance(mod, str) and isinstance(name, str) and _resolve_type(mod, name) is x:
                return ["type", mod, name]
        return _NO


# the modules of the stdlib value types the codec carries, each with the modules that can define its types first
_STDLIB = (("datetime", "_datetime", "_pydatetime"), ("decimal", "_decimal", "_pydecimal"), ("fractions",))


def _loaded(module: str, *defining: str):
    """`module`, imported now if it or a module that defines its types was loaded (by the code under test), else
    None: the worker starts without them (with `re`, which `fractions` imports, they were about 12 of the 49 ms a
    sandbox took to start on a 2-core x86 machine)."""
    if any(name in sys.modules for name in (module, *defining)):
        return __import__(module)
    return None


def _resolve_type(module: str, qualname: str):
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    return obj


class Opaque:
    """A value the codec does not carry (an exec-defined object, a generator, ...): equal to nothing, like the
    official comparison of two distinct objects with identity equality."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<opaque {self.name}>"


def decode(tree):
    """Rebuild a value from `encode`'s tree. Uses only builtin, numpy, datetime, decimal and fractions types."""
    if tree is None or isinstance(tree, bool):
        return tree
    tag = tree[0]
    if tag == "int":
        return int(tree[1])
    if tag == "float":
        return float(tree[1])
    if tag == "complex":
        return complex(float(tree[1]), float(tree[2]))
    if tag == "str":
        return tree[1]
    if tag in ("bytes", "bytearray"):
        b = bytes.fromhex(tree[1])
        return b if tag == "bytes" else bytearray(b)
    if tag == "list":
        return [decode(v) for v in tree[1]]
    if tag == "tuple":
        return tuple(decode(v) for v in tree[1])
    if tag == "dict":
        return {_hashable(decode(k)): decode(v) for k, v in tree[1]}
    if tag == "set":
        return {_hashable(decode(v)) for v in tree[1]}
    if tag == "frozenset":
        return frozenset(_hashable(decode(v)) for v in tree[1])
    if tag == "range":
        return range(tree[1], tree[2], tree[3])
    if tag in ("ndarray", "npscalar"):
        import numpy as np
        if tag == "npscalar":
            return np.dtype(tree[1]).type(decode(tree[2]))
        values = [decode(v) for v in tree[3]]
        arr = np.empty(len(values), dtype=object if tree[1] == "O" else np.dtype(tree[1]))
        for i, v in enumerate(values):
            arr[i] = v
        return arr.reshape(tree[2])
    if tag in ("datetime", "date", "time", "timedelta"):
        return _decode_datetime(tag, tree)
    if tag == "decimal":
        import decimal
        return decimal.Decimal(tree[1])
    if tag == "fraction":
        import fractions
        return fractions.Fraction(int(tree[1]), int(tree[2]))
    if tag == "type":
        __import__(tree[1])
        return _resolve_type(tree[1], tree[2])
    if tag == "opaque":
        return Opaque(tree[1])
    raise ValueError(f"unknown value tag {tag!r}")


def _decode_datetime(tag: str, tree):
    import datetime

    if tag == "datetime":
        return datetime.datetime.fromisoformat(tree[1])
    if tag == "date":
        return datetime.date.fromisoformat(tree[1])
    if tag == "time":
        return datetime.time.fromisoformat(tree[1])
    return datetime.timedelta(days=tree[1], seconds=tree[2], microseconds=tree[3])


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return Opaque(f"unhashable {type(v).__name__}")


# ------------------------------------------------------------------------------------------------ the worker
class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def dumps(tree) -> str:
    """JSON text of an encoded tree (None, bools, ints, ASCII-escaped strings and lists: what `encode` builds), as
    `json.dumps` writes it less the spaces; anything else raises. The worker does without `json`, whose import (with
    `re` and `enum`) was about 6 ms of a sandbox's start."""
    if tree is None:
        return "null"
    if tree is True or tree is False:
        return "true" if tree else "false"
    if type(tree) is int:
        return int.__repr__(tree)
    if type(tree) is str:
        return encode_basestring_ascii(tree)
    if type(tree) is list:
        return "[" + ",".join([dumps(v) for v in tree]) + "]"
    raise TypeError(f"not an encoded tree: {type(tree).__name__}")


def _set_limits(limits: dict) -> None:
    import resource
    for name, key in (("RLIMIT_AS", "as_bytes"), ("RLIMIT_CPU", "cpu_s"), ("RLIMIT_NOFILE", "nofile"),
                      ("RLIMIT_FSIZE", "fsize"), ("RLIMIT_NPROC", "nproc"), ("RLIMIT_CORE", None)):
        value = 0 if key is None else limits.get(key)
        if value is not None:
            resource.setrlimit(getattr(resource, name), (int(value), int(value)))


# seccomp (linux/seccomp.h, linux/filter.h). RLIMIT_NPROC alone does not stop a fork bomb when the evaluator runs as
# root: the kernel exempts uid 0 from it, and inside the sandbox the code is still uid 0 to the kernel.
_SECCOMP_ARCH = {  # machine: (AUDIT_ARCH, {syscall: errno}, clone, clone3)
    "x86_64": (0xC000003E, {57: 11, 58: 11}, 56, 435),  # fork, vfork -> EAGAIN
    "aarch64": (0xC00000B7, {}, 220, 435),
}
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_CLONE_THREAD, _EAGAIN, _ENOSYS = 0x00010000, 11, 38


def _seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """A classic-BPF filter: process-creating fork/vfork/clone fail with EAGAIN, clone3 with ENOSYS (glibc then falls
    back to clone, so threads still start), x32 and foreign-ABI syscalls kill the process, all else is allowed."""
    arch, errnos, clone, clone3 = _SECCOMP_ARCH[machine]
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, _RET_KILL), (ld, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, _RET_KILL)]  # the x32 ABI
    for nr, err in errnos.items():
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, _RET_ERRNO | err)]
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, _RET_ERRNO | _ENOSYS),
             (jeq, 0, 3, clone), (ld, 0, 0, 16), (jset, 1, 0, _CLONE_THREAD),  # args[0], the flags (low word)
             (ret, 0, 0, _RET_ERRNO | _EAGAIN), (ret, 0, 0, _RET_ALLOW)]
    return prog


def _forbid_processes() -> None:
    import ctypes

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    insns = _seccomp_program(os.uname().machine)
    array = (Filter * len(insns))(*[Filter(*i) for i in insns])
    prog = Prog(len(insns), array)
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) or \
            libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0):
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def _run_one(code: str, call: str, namespace: str, timeout):
    g = {"__builtins__": builtins}
    local = {} if namespace == "official" else g
    if timeout:
        _signal.signal(_signal.SIGALRM, _on_alarm)
        _signal.setitimer(_signal.ITIMER_REAL, timeout)
    try:
        exec(code, g, local)  # noqa: S102 - running it is the point; the sandbox contains it
        result = eval(call, g, local)  # noqa: S307
        return encode(result)
    except BaseException:  # noqa: BLE001 - like the reference: any failure, timeout included, is None
        return None
    finally:
        if timeout:
            _signal.setitimer(_signal.ITIMER_REAL, 0)


def _as_site_would(path: list[str]) -> None:
    """What `site` gives a process, for a worker started without it (-S): the module search path the job names
    (the interpreter's site-packages) and the builtins `site` adds (exit, quit, help, copyright, credits,
    license), without running any .pth file's code."""
    import site

    site.setquit()
    site.setcopyright()
    site.sethelper()
    sys.path.extend(p for p in path if p not in sys.path)


def main() -> None:
    job = marshal.loads(sys.stdin.buffer.read())
    _as_site_would(job.get("path", []))
    out = os.fdopen(job["fd"], "w", buffering=1)
    _set_limits(job.get("limits", {}))
    if job.get("no_fork"):
        _forbid_processes()  # before `ready`: a worker that cannot install it never runs code
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    out.write("ready\n")
    for i in range(job.get("start", 0), len(job["calls"])):
        try:
            value = _run_one(job["code"], job["calls"][i], job.get("namespace", "official"), job.get("timeout"))
            line = dumps(value)
        except BaseException:  # noqa: BLE001 - an unencodable or poisoned result is a failed test
            line = "null"
        out.write(f"{i}\t{line}\n")


if __name__ == "__main__":
    main()
