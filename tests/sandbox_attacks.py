"""Attacks on ``trajtune.sandbox``, and what each one really did, observed from outside the sandbox.

tests/test_sandbox.py runs them in-process (as whoever runs the tests, root in CI) and, through
this file run as a script, as an unprivileged user: the same attacks, checked both ways. Standard
library only, because the unprivileged copy runs on a bare interpreter.

Every check observes an effect, not only the sandbox's report: a file present in a directory
that anyone may write to, a secret's text in the output, a process alive after the call, a
connection received by a listener.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Callable

# Each attack's code runs after a header that defines OUT (a directory outside the sandbox that
# anyone may write to), SECRET (a world-readable file outside it), MARKER and PORT. Each step
# catches its own error so one refusal does not hide the next attempt; "done" ends a full run.
ATTACKS: dict[str, str] = {}

ATTACKS["hook_off_via_main"] = """
import sys
m = sys.modules["__main__"]
for name in ("_deny", "_hook", "_inside", "_path", "_rp", "deny", "hook", "check", "emit"):
    setattr(m, name, lambda *a, **k: None)
m._work, m._roots, m._W, m._count = "/", ["/"], 0, [10**9]
try:
    open(OUT + "/via_main.txt", "w").write("x"); print("wrote")
except PermissionError as e:
    print("refused", e)
print("done")
"""

ATTACKS["hook_off_via_globals"] = """
import builtins, os, posixpath, sys, types
NAMES = {"deny", "hook", "check", "emit", "inside", "resolve", "lexical", "writable", "readable",
         "check_open", "fs_change", "path_text", "base_dir", "path", "rp"}
noop = lambda *a, **k: None
f = sys._getframe()                                     # the installing program's globals, via frames
while f is not None:
    g = f.f_globals
    if g is not globals():
        for name, value in list(g.items()):
            if isinstance(value, types.FunctionType):       # defaults a function holds in a dict can change in place
                for k in value.__kwdefaults__ or {}:
                    value.__kwdefaults__[k] = noop if callable(value.__kwdefaults__[k]) else None
            if isinstance(value, (types.FunctionType, frozenset, tuple, int)) and not name.startswith("__"):
                g[name] = noop if callable(value) else type(value)()
    f = f.f_back
for mod in list(sys.modules.values()):                 # every module's helper-like names
    for name in list(getattr(mod, "__dict__", {})):
        if name.strip("_") in NAMES:
            try: setattr(mod, name, noop)
            except Exception: pass
os.path.realpath = posixpath.realpath = lambda p, **k: os.getcwd()
posixpath._joinrealpath = lambda *a, **k: (os.getcwd(), True)
os.fspath = lambda p: "inside.txt"
builtins.isinstance = lambda *a: False
builtins.any = lambda *a: False
try:
    open(OUT + "/via_globals.txt", "w").write("x"); print("wrote")
except PermissionError as e:
    print("refused", e)
print("done")
"""

ATTACKS["hook_off_via_gc"] = """
import gc, sys, types
noop = (lambda *a, **k: None).__code__
objs = []
for get in (gc.get_objects, lambda: gc.get_referrers(sys), lambda: gc.get_referents(sys.modules)):
    try: objs += list(get())
    except PermissionError as e: print("refused", e)
hit = 0
for o in objs:
    if isinstance(o, types.FunctionType) and o.__code__.co_filename == "<string>":
        try: o.__code__ = noop; hit += 1
        except Exception: pass
print("replaced", hit)
try:
    open(OUT + "/via_gc.txt", "w").write("x"); print("wrote")
except PermissionError as e:
    print("refused", e)
print("done")
"""

# Reach the hook's frames through a caught refusal's traceback: re-code any function found there,
# and forge records with anything that looks like the report token.
ATTACKS["hook_off_via_frames"] = """
import os, types
found, tokens = [], set()
def harvest(values):
    for v in values:
        if isinstance(v, str) and len(v) == 32 and set(v) <= set("0123456789abcdef"): tokens.add(v)
        elif isinstance(v, tuple): harvest(v)
        elif isinstance(v, types.FunctionType) and v not in found:
            found.append(v)
            harvest((v.__defaults__ or ()) + tuple((v.__kwdefaults__ or {}).values()))
            for c in v.__closure__ or ():
                harvest([c.cell_contents])
try:
    open(OUT + "/first.txt", "w")
except PermissionError as e:
    tb = e.__traceback__
    while tb is not None:
        harvest(tb.tb_frame.f_locals.values()); tb = tb.tb_next
changed = 0
for fn in found:
    for attr, value in (("__code__", (lambda *a, **k: None).__code__), ("__kwdefaults__", {}), ("__defaults__", None)):
        try: setattr(fn, attr, value); changed += 1
        except Exception: pass
    for k in fn.__kwdefaults__ or {}:  # in place: no audit event
        fn.__kwdefaults__[k] = None; changed += 1
print("functions", len(found), "changed", changed, "tokens", len(tokens))
for t in tokens:
    for fd in range(3, 64):
        try: os.write(fd, ("\\n" + t + "\\tforged_kind\\topen\\t/forged\\n").encode())
        except OSError: pass
try:
    open(OUT + "/via_frames.txt", "w").write("x"); print("wrote")
except PermissionError as e:
    print("refused", e)
print("done")
"""

ATTACKS["write_outside"] = """
import os
REL = os.path.relpath(OUT, os.getcwd())
steps = {
    "open": lambda: open(OUT + "/abs.txt", "w").write("x"),
    "relative": lambda: open(REL + "/rel.txt", "w").write("x"),
    "os.open": lambda: os.close(os.open(OUT + "/osopen.txt", os.O_CREAT | os.O_WRONLY)),
    "mkdir": lambda: os.mkdir(OUT + "/dir"),
    "rename": lambda: (open("local.txt", "w").write("x"), os.rename("local.txt", OUT + "/renamed.txt")),
    "dir_fd": lambda: os.close(os.open("dirfd.txt", os.O_CREAT | os.O_WRONLY, dir_fd=os.open(OUT, os.O_RDONLY))),
    "chdir": lambda: (os.chdir(OUT), open("chdir.txt", "w").write("x")),
}
for how, step in steps.items():
    try: step(); print(how, "wrote")
    except OSError as e: print(how, "failed", type(e).__name__)
print("done")
"""

ATTACKS["read_secret"] = """
import os
steps = {
    "open": lambda: open(SECRET).read(),
    "os.open": lambda: os.read(os.open(SECRET, os.O_RDONLY), 200).decode(),
    "relative": lambda: open(os.path.relpath(SECRET, os.getcwd())).read(),
    "listdir": lambda: str(os.listdir(os.path.dirname(SECRET))),
    "proc_root": lambda: open("/proc/1/root" + SECRET).read(),
}
for how, step in steps.items():
    try: print(how, step())
    except OSError as e: print(how, "failed", type(e).__name__)
print("done")
"""

ATTACKS["mkfifo_mknod"] = """
import os, stat
REL = os.path.relpath(OUT, os.getcwd())
steps = {
    "mkfifo": lambda: os.mkfifo(OUT + "/fifo"),
    "mknod_file": lambda: os.mknod(OUT + "/node", stat.S_IFREG | 0o600),
    "mknod_fifo": lambda: os.mknod(OUT + "/nodefifo", stat.S_IFIFO | 0o600),
    "relative": lambda: os.mkfifo(REL + "/relfifo"),
}
for how, step in steps.items():
    try: step(); print(how, "made")
    except OSError as e: print(how, "failed", type(e).__name__)
print("done")
"""

ATTACKS["sqlite_outside"] = """
try:
    import sqlite3
except (ImportError, PermissionError) as e:
    sqlite3 = None; print("no sqlite3", e)
def run(how):
    if how == "plain":
        c = sqlite3.connect(OUT + "/plain.db")
    elif how == "uri":
        c = sqlite3.connect("file:" + OUT + "/uri.db?mode=rwc", uri=True)
    else:
        c = sqlite3.connect(":memory:")
    if how == "attach":
        c.execute("ATTACH DATABASE '" + OUT + "/attached.db' AS a"); c.execute("CREATE TABLE a.t (x)")
    elif how == "vacuum":
        c.execute("CREATE TABLE t (x)"); c.execute("VACUUM INTO '" + OUT + "/vacuumed.db'")
    else:
        c.execute("CREATE TABLE t (x)")
    c.commit()
for how in ("plain", "uri", "attach", "vacuum") if sqlite3 else ():
    try: run(how); print(how, "ran")
    except Exception as e: print(how, "failed", type(e).__name__)
print("done")
"""

ATTACKS["native_code"] = """
import os
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    made = libc.mkdir((OUT + "/native_dir").encode(), 0o777)
    fd = libc.open((OUT + "/native_file").encode(), os.O_CREAT | os.O_WRONLY, 0o644)
    print("native calls returned", made, fd, ctypes.get_errno())
except (ImportError, PermissionError) as e:
    print("refused", e)
print("done")
"""

ATTACKS["forge_report_channel"] = """
import os
fakes = (b'{"kind": "forged_kind", "event": "open", "detail": "/forged"}\\n',
         b"\\n" + b"0" * 32 + b"\\tforged_kind\\topen\\t/forged\\n")
n = 0
for fd in range(3, 64):
    for fake in fakes:
        try: os.write(fd, fake); n += 1
        except OSError: pass
print("forged writes", n)
print("done")
"""

ATTACKS["close_report_channel"] = """
import os
os.closerange(3, 4096)
try:
    open(OUT + "/after_close.txt", "w").write("x"); print("wrote")
except PermissionError as e:
    print("refused", e)
print("done")
"""

ATTACKS["replace_report_channel"] = """
import os
r, w = os.pipe()
for fd in range(3, 64):
    if fd not in (r, w):
        try: os.dup2(w, fd)
        except OSError: pass
try:
    open(OUT + "/after_replace.txt", "w").write("x"); print("wrote")
except PermissionError as e:
    print("refused", e)
print("done")
"""

# A setsid'd grandchild that sleeps past the call, then writes outside; MARKER names it in ps.
ATTACKS["grandchild"] = """
import os, sys, time
LATE = "import sys, time; time.sleep(0.5); open(sys.argv[1], 'w').write('late')"
try:
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", LATE, OUT + "/late.txt", MARKER])
        os._exit(0)
    os.waitpid(pid, 0)
    for _ in range(100):  # until the grandchild has exec'ed
        if any(MARKER in open(f"/proc/{p}/cmdline").read() for p in os.listdir("/proc") if p.isdigit()):
            print("grandchild running"); break
        time.sleep(0.01)
except OSError as e:
    print("refused", e)
print("done")
"""

ATTACKS["network"] = """
import socket
try:
    s = socket.create_connection(("127.0.0.1", PORT), timeout=1)
    s.sendall(b"hello"); print("connected")
except OSError as e:
    print("no connection", type(e).__name__)
print("done")
"""

# Swap a symlink between an inside and an outside target while opening it for write. The outside
# link is made with a relative target that the old hook resolved from the (deeper) cwd, while the
# kernel resolves it from the link's directory; the swap renames real directories only.
ATTACKS["symlink_race"] = """
import os, sys, threading, time
W = os.getcwd()
try:
    os.symlink(OUT + "/direct.txt", "direct_link"); open("direct_link", "w").write("x"); print("direct wrote")
except OSError as e:
    print("direct failed", type(e).__name__)
os.makedirs("deep/d1/d2/d3")
out_target = os.path.relpath(OUT + "/raced.txt", W + "/box")
os.chdir("deep/d1/d2/d3")  # relative paths from here: the work dir's parent may not be searchable
BOX = "../../../../box"
made = 0
for side, target in (("_in", "inside.txt"), ("_out", out_target)):
    try:
        os.mkdir(BOX + side); os.symlink(target, BOX + side + "/link"); made += 1
    except OSError as e:
        print(side, "link failed", type(e).__name__)
sys.setswitchinterval(1e-6)
stop, swaps, opens = [], [0], [0]
def swap():
    while not stop:
        for side in ("_in", "_out"):
            try:
                os.rename(BOX + side, BOX); swaps[0] += 1
                os.rename(BOX, BOX + side)
            except OSError:
                pass
t = threading.Thread(target=swap); t.start()
end = time.monotonic() + 0.3
while time.monotonic() < end:
    try:
        with open(BOX + "/link", "w") as f: f.write("x")
        opens[0] += 1
    except OSError:
        pass
stop.append(1); t.join()
print("links", made, "swaps", swaps[0], "opens", opens[0])
print("done")
"""

ATTACKS["proc_cwd_unreadable"] = """
import os
steps = {
    "ppid_write": lambda: open(f"/proc/{os.getppid()}/cwd/ppid.txt", "w"),
    "init_write": lambda: open("/proc/1/cwd/init.txt", "w"),
    "init_read": lambda: open("/proc/1/cwd/etc/hostname").read(),
    "init_list": lambda: os.listdir("/proc/1/cwd"),
}
for how, step in steps.items():
    try: step(); print(how, "allowed")
    except PermissionError as e: print(how, "refused")
    except OSError as e: print(how, "failed", type(e).__name__)
print("done")
"""

# Violations the hook must report for each attack (when it is on).
KINDS = {
    "hook_off_via_main": {"filesystem_write"}, "hook_off_via_globals": {"filesystem_write"},
    "hook_off_via_gc": {"introspection", "filesystem_write"}, "hook_off_via_frames": {"filesystem_write"},
    "write_outside": {"filesystem_write"}, "read_secret": {"filesystem_read"},
    "mkfifo_mknod": {"filesystem_write"}, "sqlite_outside": {"filesystem_write"}, "native_code": {"native_code"},
    "forge_report_channel": {"report_channel"}, "close_report_channel": {"report_channel"},
    "replace_report_channel": {"report_channel"}, "grandchild": {"process"}, "network": {"network"},
    "symlink_race": {"filesystem_write"}, "proc_cwd_unreadable": {"filesystem_write"},
}
# Attacks that end the child instead of finishing (the hook found its channel gone).
ENDS_EARLY = {"close_report_channel", "replace_report_channel"}
# With the hook off, what the child prints when the attack really ran and only the OS stopped its effect.
RAN_WITHOUT_HOOK = {
    "write_outside": "open failed", "read_secret": "open failed", "mkfifo_mknod": "mkfifo failed",
    "sqlite_outside": "plain failed", "native_code": "native calls returned", "grandchild": "grandchild running",
    "network": "no connection", "symlink_race": "links 2",
}
# Attacks on the policy hook and its channel only make sense with the hook on.
NEED_HOOK = set(KINDS) - set(RAN_WITHOUT_HOOK)
# Layers that cannot exist without namespaces: with the hook off too, the effect happens, and the
# result must say the layer is missing.
UNCONTAINED_WITHOUT_NAMESPACES = {"grandchild": "pid_ns", "network": "net_ns"}

LIMITS = {"cpu_s": 3, "wall_s": 8.0, "memory_mb": 256, "file_size_mb": 1, "nproc": 32, "max_output_bytes": 20_000}


def matrix() -> list[tuple[str, str, bool]]:
    """(attack, isolation, hook on) cases that must be contained."""
    cases = [(name, mode, True) for name in ATTACKS for mode in ("namespaces", "none")]
    cases += [(name, "namespaces", False) for name in ATTACKS if name not in NEED_HOOK]
    return cases


def honest_cases() -> list[tuple[str, str, bool]]:
    """Cases where a missing layer lets the effect happen: the result must say it is missing."""
    return [(name, "none", False) for name in UNCONTAINED_WITHOUT_NAMESPACES]


def _marked_pids(marker: str) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(p))
        except (OSError, ValueError):
            pass
    return pids


def _accepted(listener: socket.socket) -> int:
    listener.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, OSError):
            return n
        conn.close()
        n += 1


def observe(run_python: Callable[..., Any], limits_cls: type, name: str, mode: str, hook: bool) -> dict[str, Any]:
    """Run one attack and look at its effects from outside the sandbox."""
    out = tempfile.mkdtemp(prefix="trajtune-outside-")
    os.chmod(out, 0o777)  # anyone may write here: only the sandbox stands in the way
    secret_dir = tempfile.mkdtemp(prefix="trajtune-secret-")
    os.chmod(secret_dir, 0o755)
    secret_text = "secret-" + secrets.token_hex(8)
    secret = os.path.join(secret_dir, "secret.txt")
    with open(secret, "w") as f:
        f.write(secret_text)
    os.chmod(secret, 0o644)  # world-readable: file permissions are not what protects it
    marker = "trajtune-marker-" + secrets.token_hex(8)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    header = (f"OUT = {out!r}\nSECRET = {secret!r}\nMARKER = {marker!r}\n"
              f"PORT = {listener.getsockname()[1]}\n")
    try:
        r = run_python(header + ATTACKS[name], limits_cls(**LIMITS), isolation=mode, _policy_hook=hook)
        alive = _marked_pids(marker)
        if "grandchild running" in r.stdout:
            time.sleep(0.8)  # past the grandchild's delayed write
        for pid in _marked_pids(marker):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        return {"status": r.status, "kinds": sorted(r.violation_kinds), "layers": r.layers,
                "missing": r.containment.get("missing", {}), "stdout": r.stdout, "stderr": r.stderr[-1500:],
                "present": sorted(os.listdir(out)), "leaked": secret_text in r.stdout + r.stderr,
                "alive": len(alive), "connections": _accepted(listener), "uid": os.geteuid()}
    finally:
        listener.close()
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(secret_dir, ignore_errors=True)


def assert_contained(name: str, mode: str, hook: bool, obs: dict[str, Any]) -> None:
    """The attack had no effect outside the sandbox, and (hook on) was reported as what it is."""
    where = f"{name} [{mode}, hook {'on' if hook else 'off'}]: {obs}"
    assert obs["present"] == [], "created outside: " + where
    assert not obs["leaked"], "secret leaked: " + where
    assert obs["alive"] == 0, "process outlived the call: " + where
    assert obs["connections"] == 0, "connection received: " + where
    if mode == "namespaces":
        assert {"mount_ns", "pid_ns", "net_ns"} <= set(obs["layers"]), where
    if hook:
        # every attack catches its refusals and exits 0: "ok" with the refusals listed, except that
        # tampering with the report channel always makes the headline "violation"
        assert obs["status"] == ("violation" if "report_channel" in KINDS[name] else "ok"), where
        assert KINDS[name] <= set(obs["kinds"]), where
        assert "forged_kind" not in obs["kinds"] and "policy_error" not in obs["kinds"], where
        if name not in ENDS_EARLY:
            assert "done" in obs["stdout"], "attack did not run to the end: " + where
    else:
        assert RAN_WITHOUT_HOOK[name] in obs["stdout"], "attack did not really run: " + where


def assert_missing_layer_is_declared(name: str, obs: dict[str, Any]) -> None:
    """Without namespaces and without the hook the effect happens, and the result says why."""
    layer = UNCONTAINED_WITHOUT_NAMESPACES[name]
    where = f"{name} [none, hook off]: {obs}"
    assert layer not in obs["layers"] and obs["missing"].get(layer), where
    if name == "grandchild":  # it escaped the kill: alive after the call, or it already did its delayed write
        assert obs["alive"] >= 1 or "late.txt" in obs["present"], where
    else:
        assert obs["connections"] >= 1, where


def _load_sandbox(path: str) -> Any:
    """Import a copy of trajtune/sandbox.py (with _sandbox_child.py beside it) without trajtune."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sandbox_copy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_copy"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    """Script mode: ``python sandbox_attacks.py SANDBOX_PY`` with a JSON list of cases on stdin."""
    sandbox = _load_sandbox(sys.argv[1])
    results = {}
    for name, mode, hook in json.load(sys.stdin):
        results[f"{name}|{mode}|{hook}"] = observe(sandbox.run_python, sandbox.SandboxLimits, name, mode, hook)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
