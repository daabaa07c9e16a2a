"""Run untrusted Python in a contained child process. The ONLY module in trajtune that executes code.

Model-written code (the code-interpreter environment) runs here and nowhere else. Each run:

- is a fresh process (``python -I``) in its own session, so the wall-clock timeout kills the
  whole process group;
- has rlimits: CPU seconds (SIGXCPU), address space (MemoryError), file size (EFBIG), process
  count (fork fails), open files, no core dumps;
- runs as ``nobody`` when trajtune itself runs as root, because the kernel ignores
  RLIMIT_NPROC for root and root could read or signal anything;
- gets an empty temporary working directory (also HOME and TMPDIR), removed afterwards;
- gets a scrubbed environment (PATH, LANG, HOME, TMPDIR only): the parent's secrets are not
  inherited;
- has no network: a new network namespace (``unshare -rn``) when the kernel allows it, and in
  every case an audit hook that refuses socket creation;
- runs under a policy audit hook (installed by the prelude before the user code is compiled)
  that refuses: process creation (fork/exec/spawn/subprocess/os.system), signalling other
  processes, native code (ctypes), reading outside the working directory and the
  interpreter's import path, and writing outside the working directory. Each refusal raises
  ``PermissionError`` in the child and is reported to the parent on a separate pipe, so the
  result says *what* was attempted;
- has its stdout+stderr capped (the child is killed when it exceeds the cap).

Limits of this design, stated honestly: audit hooks are a policy layer, not a security
boundary against a determined attacker with native code (which is why ctypes is refused and the
OS-level limits stay on); disk use across many files is bounded by the per-file limit times the
time limit, not by a quota. Use a container or VM for hostile multi-tenant workloads.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

NOBODY = 65534

# The child prelude: reads the user code from stdin, installs the policy hook, runs the code.
# It is a constant string run with ``python -I -c``; the user code is compiled *inside* the child.
_PRELUDE = r'''
import os, sys, json, traceback, signal, resource
for _name, _pair in json.loads(sys.argv[4]).items():
    resource.setrlimit(getattr(resource, _name), tuple(_pair))
_vfd = int(sys.argv[1]); _work = os.path.realpath(sys.argv[2])
_roots = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
_code = sys.stdin.read(); sys.stdin.close()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
_count = [0]
_rp = os.path.realpath
_W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PROC = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
         "os.startfile", "pty.spawn"}
_SIG = {"os.kill", "os.killpg", "signal.pthread_kill"}
_NET = {"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.sethostname"}
_FSW = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
        "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.chdir"}
_FSR = {"os.listdir", "os.scandir"}
def _inside(p, roots):
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)
def _path(a):
    if isinstance(a, bytes):
        a = os.fsdecode(a)
    return _rp(a) if isinstance(a, str) else None
def _deny(kind, event, detail):
    if _count[0] < 50:
        _count[0] += 1
        try:
            os.write(_vfd, (json.dumps({"kind": kind, "event": event, "detail": str(detail)[:200]}) + "\n").encode())
        except OSError:
            pass
    raise PermissionError(f"sandbox: {kind} is not allowed ({event} {str(detail)[:80]})")
def _hook(event, args):
    if event == "open":
        p = _path(args[0])
        if p is None:
            return
        mode, flags = args[1], args[2] or 0
        write = bool(flags & _W) or (isinstance(mode, str) and any(c in mode for c in "wax+"))
        if write and not _inside(p, [_work]):
            _deny("filesystem_write", event, p)
        if not write and not _inside(p, [_work] + _roots):
            _deny("filesystem_read", event, p)
    elif event in _PROC or event.startswith("os.exec") or event.startswith("os.spawn"):
        _deny("process", event, args[0] if args else "")
    elif event in _SIG:
        if not (event == "os.kill" and args[0] == os.getpid()):
            _deny("signal", event, args)
    elif event in _NET:
        _deny("network", event, args[1:3] if event == "socket.__new__" else args[1:2])
    elif event == "import" and args[0] == "_posixsubprocess":
        _deny("process", event, args[0])
    elif event.startswith("ctypes.") or (event == "import" and args[0] in ("ctypes", "_ctypes", "cffi")):
        _deny("native_code", event, args[0] if args else "")
    elif event in _FSW:
        for a in args:
            p = _path(a)
            if p is not None and not _inside(p, [_work]):
                _deny("filesystem_write", event, p)
    elif event in _FSR:
        p = _path(args[0]) if args and args[0] is not None else _rp(".")
        if p is not None and not _inside(p, [_work] + _roots):
            _deny("filesystem_read", event, p)
del signal, resource
if sys.argv[3] == "1":
    sys.addaudithook(_hook)
try:
    _c = compile(_code, "<sandbox>", "exec")
    _g = {"__name__": "__main__", "__builtins__": __builtins__}
    del _code
    exec(_c, _g)
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    sys.exit(1)
'''


@dataclass
class SandboxLimits:
    """Resource limits for one run. Defaults suit short math/data snippets."""

    cpu_s: int = 2
    wall_s: float = 5.0
    memory_mb: int = 256
    file_size_mb: int = 4
    nproc: int = 8
    nofile: int = 64
    max_output_bytes: int = 64_000


@dataclass
class SandboxResult:
    """What happened. ``status`` is the single headline; ``violations`` lists refused operations."""

    status: str  # ok | error | timeout | cpu_limit | memory_limit | file_size_limit | output_limit | violation | failed_to_start
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    violations: list[dict[str, str]] = field(default_factory=list)
    containment: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def violation_kinds(self) -> set[str]:
        return {v["kind"] for v in self.violations}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def observation(self) -> str:
        """A compact text for an agent: output, or what went wrong."""
        out = self.stdout
        if self.status != "ok":
            tail = self.stderr.strip().splitlines()[-3:]
            why = {"timeout": "wall-clock timeout", "cpu_limit": "CPU time limit exceeded",
                   "memory_limit": "memory limit exceeded", "file_size_limit": "file size limit exceeded",
                   "output_limit": "output too long", "violation": "blocked operation: " + ", ".join(sorted(self.violation_kinds)),
                   "failed_to_start": "sandbox failed to start"}.get(self.status, "error")
            out = (out + ("\n" if out and not out.endswith("\n") else "") + f"[{why}]" +
                   ("\n" + "\n".join(tail) if tail else ""))
        return out


def _world_executable(path: str) -> bool:
    """Whether an unprivileged user can execute ``path`` (every parent dir searchable)."""
    try:
        real = os.path.realpath(path)
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        d = os.path.dirname(real)
        while True:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
            if d == "/":
                return True
            d = os.path.dirname(d)
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _interpreter_and_uid() -> tuple[str, int | None]:
    """Pick the interpreter and, when we are root, the unprivileged uid to run it as."""
    if os.geteuid() != 0:
        return sys.executable, None
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or "",
                  "/usr/bin/python3", "/usr/local/bin/python3"]
    for c in candidates:
        if c and os.path.exists(c) and _world_executable(c):
            return os.path.realpath(c), NOBODY
    return sys.executable, None  # no interpreter nobody can run: stay root (NPROC not enforced)


def _rlimits(limits: SandboxLimits) -> dict[str, tuple[int, int]]:
    """The rlimits the prelude applies to itself before compiling the user code.

    Applied inside the child (not with ``preexec_fn``) because ``preexec_fn`` is unsafe when the
    parent has threads, and the environments call the sandbox from ``step_batch``'s threads.
    """
    mb = 1024 * 1024
    return {"RLIMIT_CPU": (limits.cpu_s, limits.cpu_s + 1),
            "RLIMIT_AS": (limits.memory_mb * mb, limits.memory_mb * mb),
            "RLIMIT_FSIZE": (limits.file_size_mb * mb, limits.file_size_mb * mb),
            "RLIMIT_NPROC": (limits.nproc, limits.nproc),
            "RLIMIT_NOFILE": (limits.nofile, limits.nofile),
            "RLIMIT_CORE": (0, 0)}


def _identity(uid: int | None) -> dict[str, Any]:
    """Popen arguments that switch to ``uid`` in the child (done in C, thread-safe)."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


@functools.lru_cache(maxsize=1)
def _netns_available() -> bool:
    """Whether ``unshare -rn`` works here for the sandbox user (probed once)."""
    exe = shutil.which("unshare")
    if not exe:
        return False
    _, uid = _interpreter_and_uid()
    try:
        r = subprocess.run([exe, "-rn", "true"], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=5, cwd="/", **_identity(uid))
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _pump(stream: Any, sink: bytearray, budget: list[int], over: threading.Event, proc: subprocess.Popen) -> None:
    """Copy ``stream`` into ``sink`` until EOF; on exceeding the shared budget, kill the group."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        take = max(0, min(len(chunk), budget[0]))
        sink.extend(chunk[:take])
        budget[0] -= len(chunk)
        if budget[0] < 0 and not over.is_set():
            over.set()
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def run_python(code: str, limits: SandboxLimits | None = None, *, files: dict[str, str] | None = None,
               network_namespace: bool | None = None, _policy_hook: bool = True) -> SandboxResult:
    """Run ``code`` in the sandbox and report what happened (never raises for the code's behaviour).

    ``files`` are written into the (otherwise empty) working directory first, e.g. data files.
    ``network_namespace`` None means "use one when available". ``_policy_hook=False`` exists only
    so tests can check that the OS-level limits hold on their own (defence in depth).
    """
    limits = limits or SandboxLimits()
    python, uid = _interpreter_and_uid()
    use_netns = _netns_available() if network_namespace is None else (network_namespace and _netns_available())
    root = tempfile.mkdtemp(prefix="trajtune-sandbox-")
    work = os.path.join(root, "work")
    os.mkdir(work, 0o700)
    containment = {"uid": uid if uid is not None else os.geteuid(), "network": "netns+audit_hook" if use_netns else "audit_hook",
                   "limits": asdict(limits), "interpreter": python}
    vr, vw = os.pipe()
    try:
        for name, text in (files or {}).items():
            target = os.path.realpath(os.path.join(work, name))
            if not target.startswith(os.path.realpath(work) + os.sep):
                raise ValueError(f"sandbox file name {name!r} escapes the working directory")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
        if uid is not None:
            for dirpath, _, filenames in os.walk(work):
                os.chown(dirpath, uid, uid)
                for fn in filenames:
                    os.chown(os.path.join(dirpath, fn), uid, uid)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work,
               "PYTHONIOENCODING": "utf-8"}
        cmd = [python, "-I", "-c", _PRELUDE, str(vw), work, "1" if _policy_hook else "0", json.dumps(_rlimits(limits))]
        if use_netns:
            cmd = [shutil.which("unshare") or "unshare", "-rn", *cmd]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=work, env=env, start_new_session=True, pass_fds=(vw,), close_fds=True,
                                    **_identity(uid))
        except OSError as e:
            return SandboxResult("failed_to_start", "", str(e), None, 0.0, [], containment)
        os.close(vw)
        vw = -1
        out, err = bytearray(), bytearray()
        budget = [limits.max_output_bytes]
        over = threading.Event()
        pumps = [threading.Thread(target=_pump, args=(s, b, budget, over, proc), daemon=True)
                 for s, b in ((proc.stdout, out), (proc.stderr, err))]
        for t in pumps:
            t.start()
        try:
            assert proc.stdin is not None
            proc.stdin.write(code.encode("utf-8", "surrogatepass"))
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
        _kill_group(proc)  # stray grandchildren, if any escaped the process limit
        for t in pumps:
            t.join(timeout=2.0)
        duration = time.monotonic() - start
        violations = _read_violations(vr)
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        status = _classify(proc.returncode, timed_out, over.is_set(), stderr, violations)
        return SandboxResult(status, stdout, stderr, proc.returncode, duration, violations, containment)
    finally:
        if vw >= 0:
            os.close(vw)
        os.close(vr)
        shutil.rmtree(root, ignore_errors=True)


def _read_violations(fd: int) -> list[dict[str, str]]:
    os.set_blocking(fd, False)
    data = b""
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            v = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(v, dict) and "kind" in v:
            out.append({k: str(v.get(k, "")) for k in ("kind", "event", "detail")})
    return out


def _classify(rc: int | None, timed_out: bool, over: bool, stderr: str, violations: list[dict[str, str]]) -> str:
    if over:
        return "output_limit"
    if timed_out:
        return "timeout"
    if rc is not None and rc < 0:
        sig = -rc
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and "MemoryError" not in stderr):
            return "cpu_limit"
        if sig == signal.SIGXFSZ:
            return "file_size_limit"
        if sig == signal.SIGSEGV:
            return "memory_limit"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if "MemoryError" in last:
        return "memory_limit"
    if "File too large" in stderr or "[Errno 27]" in stderr:
        return "file_size_limit"
    if rc == 0:
        return "ok"
    if violations:
        return "violation"
    return "error"
