"""The child side of ``trajtune.sandbox``: the program that runs inside the sandboxed process.

The parent runs this file's text with ``python -I -c``, so it uses the standard library only and
never imports trajtune. It reads one JSON header line from stdin (report fd, token, rlimits,
mode, the exit status that means "report channel lost"), then the user code; applies the
rlimits; installs the policy hook; and runs the code as a fresh ``__main__`` module that holds
nothing of the sandbox's.

How the hook is kept out of reach of the code it polices:

- ``install_hook`` builds it from copies of this module's functions whose defaults hold the
  run's state and whose globals are empty; the copies are referenced from nowhere except the
  interpreter's hook list and each other: no module, global or builtin names them.
- Everything it uses is bound as positional defaults when it is built (kept in a tuple; keyword-only
  defaults would sit in a dict that can be changed in place): strings, tuples, frozensets and C
  functions. It looks up no globals and no builtins (a test checks the bytecode), so
  patching ``os``, ``os.path``, ``builtins`` or this module's globals changes nothing it does.
  It never calls code the user wrote: it only reads path arguments that are exact ``str`` or
  ``bytes`` and resolves them itself with ``posix.lstat``/``readlink``.
- Its functions cannot be re-coded: assigning ``__code__``, ``__defaults__`` or
  ``__kwdefaults__`` on one of them is refused, and so are ``gc.get_objects``,
  ``gc.get_referrers``, ``gc.get_referents`` and ``sys._current_frames``, the ways to reach
  objects one holds no reference to. Garbage collection is paused while the hook runs, so no
  finalizer of the user's runs inside it.
- The reporting capability (fd and token) is deleted from the hook's frames before a refusal
  propagates, so a caught ``PermissionError``'s traceback does not carry it.

Residual, stated honestly: a Python signal handler that fires while the hook is running receives
the hook's frame and could read the token; that forges reports, it lifts no restriction, and the
OS layers (mount, PID and network namespaces) hold whatever the hook does.
"""

import _stat
import gc
import posix
import types

_WRITE_FLAGS = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_APPEND | posix.O_TRUNC
# Events that change the filesystem: (event, ((path index, dir_fd index or -1), ...)).
_FS_CHANGES = (
    ("os.chmod", ((0, 2),)), ("os.chown", ((0, 3),)), ("os.mkdir", ((0, 2),)), ("os.remove", ((0, 1),)),
    ("os.rmdir", ((0, 1),)), ("os.utime", ((0, 3),)), ("os.truncate", ((0, -1),)), ("os.chflags", ((0, -1),)),
    ("os.setxattr", ((0, -1),)), ("os.removexattr", ((0, -1),)), ("os.chdir", ((0, -1),)),
    ("os.rename", ((0, 2), (1, 3))), ("os.link", ((0, 2), (1, 3))), ("os.symlink", ((1, 2),)),
)
_PROCESS = frozenset({"os.fork", "os.forkpty", "os.system", "os.posix_spawn", "subprocess.Popen", "pty.spawn",
                      "os.startfile"})
_SIGNAL = frozenset({"os.kill", "os.killpg", "signal.pthread_kill"})
_NETWORK = frozenset({"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                      "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
                      "socket.sethostname"})
_INTROSPECTION = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames"})
_NATIVE_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend", "_testcapi", "_testinternalcapi"})
_NATIVE_EVENTS = frozenset({"sqlite3.enable_load_extension", "sqlite3.load_extension"})
# Modules that create files in C with no audit event (sqlite ATTACH / VACUUM INTO, dbm files):
# refused when no mount namespace confines the filesystem.
_UNSEEN_WRITERS = frozenset({"_sqlite3", "_dbm", "_gdbm"})
# Our own events, raised by the stand-ins for os.mkfifo / os.mknod (which have no audit event).
_UNSEEN_NODES = frozenset({"os.mkfifo", "os.mknod"})
_READ_LISTINGS = frozenset({"os.listdir", "os.scandir"})


def lexical(path, base):
    """``path`` made absolute against ``base`` and normalized without touching the filesystem."""
    if not path.startswith("/"):
        path = base + "/" + path
    parts = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def resolve(path, base, lstat=posix.lstat, readlink=posix.readlink, islink=_stat.S_ISLNK, OSError=OSError):
    """The path the kernel reaches now (symlinks followed), or None when that cannot be known.

    Like ``os.path.realpath`` but using only C functions, and returning None (the caller then
    refuses) where realpath would raise, e.g. on ``/proc/<pid>/cwd`` of another user's process.
    """
    if not path.startswith("/"):
        path = base + "/" + path
    todo = path.split("/")
    todo.reverse()
    done = []
    hops = 0
    while todo:
        part = todo.pop()
        if part == "" or part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        done.append(part)
        here = "/" + "/".join(done)
        try:
            mode = lstat(here).st_mode
        except OSError:
            continue  # missing or unsearchable: the rest stays lexical, as realpath does
        if not islink(mode):
            continue
        hops += 1
        try:
            target = readlink(here)
        except OSError:
            return None
        if hops > 40:
            return None
        done.pop()
        if target.startswith("/"):
            done.clear()
        more = target.split("/")
        more.reverse()
        todo.extend(more)
    return "/" + "/".join(done)


def inside(path, dirs):
    """Whether ``path`` is one of ``dirs`` or below one."""
    for d in dirs:
        if path == d or path.startswith(d + "/") or d == "/":
            return True
    return False


def path_text(x, type=type, str=str, bytes=bytes):
    """A path argument as str when it is exact ``str``/``bytes`` (never calls user code), else None."""
    if type(x) is str:
        return x
    if type(x) is bytes:
        return x.decode("utf-8", "surrogateescape")
    return None


def base_dir(dir_fd, getcwd=posix.getcwd, readlink=posix.readlink, type=type, int=int, OSError=OSError):
    """The directory a relative path is resolved from: the cwd, or the directory ``dir_fd`` names."""
    try:
        if type(dir_fd) is int and dir_fd >= 0:  # audit events pass -1 for "no dir_fd"
            return readlink("/proc/self/fd/" + int.__repr__(dir_fd))
        return getcwd()
    except OSError:
        return None


# The functions below take per-run state (``work``, ``roots``, the channel) as defaults that
# ``install_hook`` fills in through ``_bind``; the placeholders here are never used.

def writable(path, base, work=(), lexical=lexical, resolve=resolve, inside=inside):
    """None if writing ``path`` stays in the working directory, else a refusal.

    Both the lexical and the resolved path must be inside: with symlink targets confined to
    relative, ``..``-free paths (see ``fs_change``), no swap of a link or directory between this
    check and the system call can make the kernel land outside.
    """
    if base is None:
        return ("filesystem_write", path)
    real = resolve(path, base)
    if real is None or not inside(lexical(path, base), work) or not inside(real, work):
        return ("filesystem_write", real or path)
    return None


def readable(path, base, work=(), roots=(), resolve=resolve, inside=inside):
    """None if ``path`` may be read: it resolves inside the working directory or the import path."""
    real = None if base is None else resolve(path, base)
    if real is None or not (inside(real, work) or inside(real, roots)):
        return ("filesystem_read", real or path)
    return None


def check_open(args, work=(), writable=writable, readable=readable, path_text=path_text, base_dir=base_dir,
               resolve=resolve, inside=inside, stat=posix.stat, isdir=_stat.S_ISDIR, type=type, str=str, int=int,
               W=_WRITE_FLAGS, OSError=OSError):
    path, mode, flags = args[0], args[1], args[2]
    if type(path) is int:
        return None  # an fd already opened under this policy
    p = path_text(path)
    if p is None:
        return ("filesystem_read", "a path that is not str or bytes")
    base = base_dir(None)
    write = type(flags) is int and flags & W
    if type(mode) is str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
        write = True
    if write:
        return writable(p, base)
    verdict = readable(p, base)
    if verdict is None:
        real = resolve(p, base)
        try:
            # a directory fd outside the working directory would let dir_fd= calls escape
            if not inside(real, work) and isdir(stat(real).st_mode):
                return ("filesystem_read", real + " (a directory)")
        except OSError:
            pass
    return verdict


def fs_change(event, args, writable=writable, table=_FS_CHANGES, path_text=path_text, base_dir=base_dir,
              type=type, int=int, len=len):
    """Refuse changes outside the working directory, and symlinks that could point out of it."""
    for name, positions in table:
        if name != event:
            continue
        if event == "os.symlink":
            target = path_text(args[0])
            if target is None or target.startswith("/") or ".." in target.split("/"):
                return ("filesystem_write", "symlink to " + (target or "?") + " (targets must be relative, without ..)")
        for at, fd_at in positions:
            if type(args[at]) is int:
                continue  # fchdir / ftruncate / fchmod / fchown on an fd opened under this policy
            p = path_text(args[at])
            if p is None:
                return ("filesystem_write", "a path that is not str or bytes")
            verdict = writable(p, base_dir(args[fd_at] if 0 <= fd_at < len(args) else None))
            if verdict is not None:
                return verdict
        return None
    return None


def check_os(event, args, fs_change=fs_change, readable=readable, base_dir=base_dir, text=path_text, type=type,
             int=int, getpid=posix.getpid, PROCESS=_PROCESS, SIGNAL=_SIGNAL, UNSEEN_NODES=_UNSEEN_NODES,
             READ_LISTINGS=_READ_LISTINGS):
    """The verdict on an ``os.*`` event."""
    if event in UNSEEN_NODES:
        return ("filesystem_write", text(args[0]) or "?")
    if event in READ_LISTINGS:
        if type(args[0]) is int:
            return None
        p = "." if args[0] is None else text(args[0])
        return readable(p, base_dir(None)) if p is not None else ("filesystem_read", "?")
    if event in PROCESS or event.startswith("os.exec") or event.startswith("os.spawn"):
        return ("process", event)
    if event in SIGNAL:
        if event == "os.kill" and type(args[0]) is int and args[0] == getpid():
            return None
        return ("signal", event)
    return fs_change(event, args)


def check_sqlite(database, writable=writable, base_dir=base_dir, text=path_text):
    """The verdict on opening a sqlite database (a path or a ``file:`` URI)."""
    db = text(database)
    if db is None:
        return ("filesystem_write", "sqlite3.connect with a path that is not str or bytes")
    if db.startswith("file:"):
        db = db[5:].split("?")[0].split("#")[0]
        if db.startswith("//"):
            db = "/" + db[2:].partition("/")[2]
    if db == "" or db == ":memory:":
        return None
    return writable(db, base_dir(None))


def check(event, args, ours, confined=False, check_os=check_os, check_open=check_open, check_sqlite=check_sqlite,
          text=path_text, PROCESS=_PROCESS, NETWORK=_NETWORK, INTROSPECTION=_INTROSPECTION,
          NATIVE_MODULES=_NATIVE_MODULES, NATIVE_EVENTS=_NATIVE_EVENTS, UNSEEN_WRITERS=_UNSEEN_WRITERS):
    """None when ``event`` may proceed, else (kind, detail)."""
    if event == "open":
        return check_open(args)
    if event.startswith("os."):
        return check_os(event, args)
    if event == "import":
        name = text(args[0]) or ""
        if name == "_posixsubprocess":
            return ("process", name)
        if name in NATIVE_MODULES:
            return ("native_code", name)
        if name in UNSEEN_WRITERS and not confined:
            return ("filesystem_write", name + " writes files the hook cannot see (no mount namespace)")
        return None
    if event in PROCESS:
        return ("process", event)
    if event in NETWORK:
        return ("network", event)
    if event in INTROSPECTION:
        return ("introspection", event)
    if event.startswith("ctypes.") or event in NATIVE_EVENTS:
        return ("native_code", event)
    if event == "object.__setattr__" or event == "object.__delattr__":
        for f in ours:
            if args[0] is f:
                return ("introspection", "changing the policy hook")
        return None
    if event == "sqlite3.connect":
        return check_sqlite(args[0])
    return None


def emit(kind, event, detail, fd=-1, ident=(), token="", lost=1, fstat=posix.fstat, write=posix.write,
         exit=posix._exit, OSError=OSError):
    """Write one authenticated record to the report channel; end the process if it is gone."""
    fields = record = None
    try:
        fields = [token, kind, event, detail[:200]]
        for i in (0, 1, 2, 3):
            fields[i] = fields[i].replace("\t", " ").replace("\n", " ").replace("\r", " ")
        record = ("\n" + "\t".join(fields) + "\n").encode("utf-8", "surrogateescape")
        try:
            st = fstat(fd)
            same = st.st_dev == ident[0] and st.st_ino == ident[1]
        except OSError:
            same = False
        if not same:
            exit(lost)
        try:
            write(fd, record)
        except OSError:
            exit(lost)
        return "sandbox: " + kind + " is not allowed (" + event + " " + detail[:80] + ")"
    finally:
        del fd, ident, token, write, fields, record  # nothing that can report outlives this frame


def hook(event, args, check=check, emit=emit, ours=(), isenabled=gc.isenabled, disable=gc.disable,
         enable=gc.enable, PermissionError=PermissionError, ImportError=ImportError, BaseException=BaseException):
    """The audit hook: refuse (and report) what ``check`` refuses, with garbage collection paused."""
    was = isenabled()
    disable()
    verdict = message = None
    try:
        try:
            verdict = check(event, args, ours)
        except BaseException:
            verdict = ("policy_error", event)  # fail closed, and say so
        if verdict is not None:
            message = emit(verdict[0], event, verdict[1])
    finally:
        if was:
            enable()
        del check, emit, ours
    if verdict is not None:
        # a refused import raises ImportError, so ``try: import ctypes except ImportError`` degrades
        raise (ImportError if event == "import" else PermissionError)(message)


def _defaults(fn, **values):
    """``fn``'s positional defaults with those named in ``values`` replaced."""
    code = fn.__code__
    names = code.co_varnames[code.co_argcount - len(fn.__defaults__):code.co_argcount]
    assert set(values) <= set(names), set(values) - set(names)
    return tuple(values.get(n, d) for n, d in zip(names, fn.__defaults__))


def _bind(fn, **values):
    """A copy of ``fn`` with per-run defaults and empty globals (it reads none)."""
    return types.FunctionType(fn.__code__, {"__builtins__": {}}, fn.__name__, _defaults(fn, **values))


def install_hook(fd, token, mode, lost_exit, sys, os_module):
    """Build the policy hook with its state bound as positional defaults, install it, and forget it."""
    st = posix.fstat(fd)
    work = (resolve(posix.getcwd(), "/"),)
    roots = []
    for p in sys.path:
        r = resolve(p, "/") if p and type(p) is str and p.startswith("/") else None
        if r is not None and r not in roots:
            roots.append(r)
    w = _bind(writable, work=work)
    r = _bind(readable, work=work, roots=tuple(roots))
    opens = _bind(check_open, work=work, writable=w, readable=r)
    changes = _bind(fs_change, writable=w)
    sqlite = _bind(check_sqlite, writable=w)
    os_events = _bind(check_os, fs_change=changes, readable=r)
    c = _bind(check, confined=mode == "namespaces", check_os=os_events, check_open=opens, check_sqlite=sqlite)
    e = _bind(emit, fd=fd, ident=(st.st_dev, st.st_ino), token=token, lost=lost_exit)
    h = _bind(hook, check=c, emit=e)
    # refuse re-coding any of them: the hook's own parts and the shared helpers they call
    ours = (lexical, resolve, inside, path_text, base_dir, w, r, opens, changes, sqlite, os_events, c, e, h)
    h.__defaults__ = _defaults(h, ours=ours)
    sys.addaudithook(h)
    _replace_unseen_node_makers(sys.audit, os_module)


def _replace_unseen_node_makers(audit, os_module):
    """``os.mkfifo``/``os.mknod`` raise no audit event: replace them by stand-ins that raise ours.

    The stand-ins never make the node (they hold no reference to the real functions), so they
    cannot be used to reach them. Code that rebuilds the ``posix`` module could still get the
    originals; the mount namespace is what stops those outside the working directory.
    """
    def refuse(name):
        def stand_in(path, *args, _audit=audit, _event="os." + name, **kwargs):
            _audit(_event, path)
            raise PermissionError("sandbox: " + name + " is not allowed")
        return stand_in

    for name in ("mkfifo", "mknod"):
        stand_in = refuse(name)
        setattr(os_module, name, stand_in)
        setattr(posix, name, stand_in)


def _run_user_code(code, sys):
    """Run ``code`` as a fresh ``__main__`` module: it sees none of this program's names."""
    import builtins

    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    compiled = compile(code, "<sandbox>", "exec")
    del code
    exec(compiled, module.__dict__)


def main():
    import json
    import os
    import resource
    import signal
    import sys

    header = json.loads(sys.stdin.readline())
    code = sys.stdin.read()
    sys.stdin.close()
    for name, pair in header["rlimits"].items():
        resource.setrlimit(getattr(resource, name), tuple(pair))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-size write fails with EFBIG instead of killing
    sys.dont_write_bytecode = True  # importing must not try to write .pyc files outside the working directory
    if header["hook"]:
        install_hook(header["fd"], header["token"], header["mode"], header["lost_exit"], sys, os)
    else:
        os.close(header["fd"])
    del header
    _run_user_code(code, sys)


if __name__ == "__main__":
    main()
