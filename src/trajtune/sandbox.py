"""Run untrusted Python in a contained child process. The ONLY module in trajtune that executes code.

Model-written code (the code-interpreter environment) runs here and nowhere else. Containment is
layered; every result lists the layers that were active (``SandboxResult.layers``) and why each
missing one is missing (``containment["missing"]``).

OS layers, which hold whatever the code does, native code included (bubblewrap, ``bwrap``):

- ``mount_ns``: the child sees an empty, read-only root into which only the system directories
  (``/usr``, a few ``/etc`` files) and the interpreter's prefix and import path are bound
  read-only, plus a fresh ``/proc`` and a minimal read-only ``/dev``. The working directory is the
  only writable place. Nothing else of the host (home directories, ``/tmp``, the project, other
  runs) is visible, so it can be neither read nor written, whatever the file permissions.
- ``pid_ns``: its own PID namespace. When the call returns or times out, the namespace's init
  ends and the kernel kills every process left in it, ``setsid`` grandchildren included; if
  trajtune itself dies, ``--die-with-parent`` ends the sandbox too.
- ``net_ns``: its own network namespace holding only a loopback device: no connection reaches
  the host, not even its 127.0.0.1. Also its own IPC and UTS namespaces (``ipc_ns``).
- all of this inside an unprivileged user namespace: no capabilities, and no nested user
  namespaces where bwrap supports ``--disable-userns``.

Process layers, always on:

- ``uid_switch``: when trajtune runs as root, the child runs as ``nobody`` (the kernel ignores
  RLIMIT_NPROC for root, and root could read or signal anything).
- ``rlimits``: CPU seconds (SIGXCPU), address space (MemoryError), file size (EFBIG), process
  count (fork fails), open files, no core dumps. A wall-clock timeout and an output cap kill the
  child. The working directory (also HOME and TMPDIR) is a fresh temporary directory removed
  afterwards, and the environment is scrubbed (PATH, LANG, HOME, TMPDIR only).

Policy layer (``audit_hook``): an audit hook in the child, installed before the user code is
compiled, refuses process creation, signals to other processes, native code (ctypes), sockets,
reading outside the working directory and the import path, writing outside the working
directory, symlinks that could point out of it, ``mkfifo``/``mknod`` (which raise no audit event
of their own), and the introspection that would reach the hook. Each refusal raises in the child
and is reported to the parent, so the result says *what* was attempted. User code cannot reach
the hook to switch it off (see ``trajtune._sandbox_child``). Reports carry a per-run token, so
lines the code writes to the report channel itself are flagged as forged, never taken as real; if
the code closes or replaces the channel, the next refusal ends the child with a status the parent
reports as a ``report_channel`` violation. The hook is a policy and reporting layer, not the
boundary: it checks before the system call, and it sees only what raises audit events.

Without namespaces (bwrap missing, or user namespaces disabled: ``isolation="auto"`` then falls
back with a warning; ``isolation="none"`` asks for it) the OS layers are missing and the result
says so. Filesystem and network policy then rest on the hook alone, best effort: it also refuses
the sqlite3 and dbm modules, which write files it cannot see, but code that rebuilds a C module
can get ``mkfifo`` back; a process that leaves the process group (``setsid``) could outlive the
call if the hook were bypassed; and when trajtune is not root no uid switch protects the caller's
own files. Install bubblewrap (``make`` does, as root) or use a container or VM for hostile code.

Disk use across many files is bounded by the per-file limit times the time limit, not by a quota.
Under bwrap, exit statuses 129-192 are read as deaths by signal (bwrap reports signal N as 128+N).
"""

from __future__ import annotations

import functools
import hmac
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

NOBODY = 65534
Isolation = Literal["auto", "namespaces", "none"]

# The program the child runs (``python -I -c``): reads the header and code from stdin, applies the
# rlimits, installs the policy hook, runs the code. Kept as a file so it can be read and tested.
_CHILD_PROGRAM = Path(__file__).with_name("_sandbox_child.py").read_text(encoding="utf-8")
# The child's exit status when its hook refused something but the report channel was gone. Code
# that exits with it by itself only gets its own run reported as a report_channel violation.
_CHANNEL_LOST_EXIT = 97
_MAX_VIOLATIONS = 50
_MAX_REPORT_BYTES = 1 << 20
_NS_LAYERS = ("mount_ns", "pid_ns", "net_ns", "ipc_ns")
_ETC_FILES = ("ld.so.cache", "localtime", "passwd", "group", "alternatives")


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
    """What happened. ``status`` is the single headline; ``violations`` lists refused operations.

    ``violations`` holds every refusal the policy hook reported, also those the code caught and
    went on from (then ``status`` is "ok"). ``status`` is "violation" when the code failed after a
    refusal, or tampered with the report channel (a ``report_channel`` entry says how).
    ``containment`` says which layers were active (``layers``) and why any other is missing.
    """

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

    @property
    def layers(self) -> list[str]:
        """The containment layers that were active for this run (see the module docstring)."""
        return list(self.containment.get("layers", []))

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


def _env(work: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work,
            "PYTHONIOENCODING": "utf-8"}


@dataclass(frozen=True)
class _Bwrap:
    """How to start bubblewrap here: its path, the directories to bind, and its flag support."""

    exe: str
    roots: tuple[str, ...]
    disable_userns: bool

    def command(self, work: str) -> list[str]:
        """The bwrap argv prefix for one run whose working directory is ``work``."""
        cmd = [self.exe, "--unshare-all", "--unshare-user", "--die-with-parent"]
        cmd += ["--disable-userns"] if self.disable_userns else []
        cmd += _system_binds()
        for d in self.roots:
            cmd += ["--ro-bind", d, d]
        # the root stays writable until every mount point exists, then everything but work is read-only
        cmd += ["--proc", "/proc", "--dev", "/dev", "--bind", work, work, "--chdir", work,
                "--remount-ro", "/", "--remount-ro", "/dev", "--"]
        return cmd


def _system_binds() -> list[str]:
    """Read-only binds for /usr (and the merged-/usr links or directories) and a few /etc files."""
    args: list[str] = []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    args += ["--ro-bind", "/usr", "/usr"]
    for f in _ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{f}", f"/etc/{f}"]
    return args


@functools.lru_cache(maxsize=None)
def _import_roots(python: str, uid: int | None) -> tuple[str, ...]:
    """The directories outside /usr the child interpreter needs (prefixes and import path), as it sees them."""
    probe = ("import json, os, sys\n"
             "ds = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]\n"
             "print(json.dumps([os.path.realpath(d) for d in ds if d and os.path.isdir(d)]))")
    try:
        r = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, cwd="/",
                           env={"PATH": "/usr/bin:/bin"}, **_identity(uid))
        dirs = json.loads(r.stdout) if r.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        dirs = []  # the probe run below then says what is wrong
    dirs += [os.path.dirname(python), os.path.dirname(os.path.realpath(python))]
    tmp = os.path.realpath(tempfile.gettempdir())
    keep: list[str] = []
    for d in sorted(set(dirs)):
        # /usr is bound anyway; a directory holding the temp dir would expose other runs and temp files
        if d == "/usr" or d.startswith("/usr/") or tmp == d or tmp.startswith(d.rstrip("/") + "/"):
            continue
        if not any(d == k or d.startswith(k + "/") for k in keep):
            keep.append(d)
    return tuple(keep)


def _find_bwrap() -> str | None:
    return shutil.which("bwrap", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin"]))


@functools.lru_cache(maxsize=None)
def _namespaces(python: str, uid: int | None) -> tuple[_Bwrap | None, str]:
    """(how to run bwrap, "") when namespaces work here for the sandbox user, else (None, why not).

    Probed once per interpreter and user by starting the real sandbox on an empty program.
    """
    exe = _find_bwrap()
    if exe is None:
        return None, "bubblewrap (bwrap) is not installed; `make` installs it when run as root"
    roots = _import_roots(python, uid)
    last = ""
    root = tempfile.mkdtemp(prefix="trajtune-sandbox-")
    try:
        work = _make_workdir(root, {}, uid)
        for disable_userns in (True, False):
            bw = _Bwrap(exe, roots, disable_userns)
            try:
                r = subprocess.run(bw.command(work) + [python, "-I", "-c", "pass"], capture_output=True, text=True,
                                   timeout=60, cwd=work, env=_env(work), **_identity(uid))
            except (OSError, subprocess.SubprocessError) as e:
                return None, f"bubblewrap could not start: {e}"
            if r.returncode == 0:
                return bw, ""
            last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return None, f"bubblewrap cannot create namespaces here ({last}); are user namespaces disabled?"


@functools.lru_cache(maxsize=None)
def _warn_without_namespaces(why: str) -> None:
    """Say once per process that ``auto`` fell back to the weaker layers, and why."""
    warnings.warn(f"trajtune.sandbox runs code without namespaces ({why}): only rlimits, the uid switch "
                  "(as root) and the audit hook are active; see SandboxResult.layers", RuntimeWarning, stacklevel=3)


def _containment(bw: _Bwrap | None, why_not: str, uid: int | None, hook: bool, limits: SandboxLimits,
                 python: str) -> dict[str, Any]:
    """The active layers and, for each missing one, why: the honest summary every result carries."""
    layers, missing = ["rlimits"], {}
    if uid is not None:
        layers.append("uid_switch")
    else:
        missing["uid_switch"] = ("trajtune is not root: the child runs as the calling user" if os.geteuid() != 0
                                 else "no interpreter the unprivileged user can execute: the child runs as root")
    for layer in _NS_LAYERS:
        if bw is not None:
            layers.append(layer)
        else:
            missing[layer] = why_not
    if hook:
        layers.append("audit_hook")
    else:
        missing["audit_hook"] = "turned off by the caller (_policy_hook=False)"
    return {"isolation": "namespaces" if bw is not None else "none", "layers": layers, "missing": missing,
            "uid": uid if uid is not None else os.geteuid(), "interpreter": python, "limits": asdict(limits)}


def _make_workdir(root: str, files: dict[str, str], uid: int | None) -> str:
    """Create ``root/work`` holding ``files``, owned by the sandbox user."""
    work = os.path.join(root, "work")
    os.mkdir(work, 0o700)
    for name, text in files.items():
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
        # the sandbox user must reach work by its absolute path (HOME, TMPDIR, bwrap's bind)
        os.chmod(root, 0o711)
    return work


def _pump(stream: Any, sink: bytearray, budget: list[int], over: threading.Event, kill: Callable[[], None]) -> None:
    """Copy ``stream`` into ``sink`` until EOF; on exceeding the shared budget, kill the run."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        take = max(0, min(len(chunk), budget[0]))
        sink.extend(chunk[:take])
        budget[0] -= len(chunk)
        if budget[0] < 0 and not over.is_set():
            over.set()
            kill()


def _kill_group(proc: subprocess.Popen, confined: bool) -> None:
    """Kill the child and its process group.

    Under bwrap, first the PID namespace's init (bwrap's child): the kernel then kills every
    process in the namespace before that init is gone, and bwrap exits only after it, so once
    ``proc.wait()`` returns nothing of the run is alive. Killing bwrap first could return sooner.
    """
    if confined and proc.poll() is None:  # not reaped yet, so proc.pid is still bwrap's
        for pid in _children(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def run_python(code: str, limits: SandboxLimits | None = None, *, files: dict[str, str] | None = None,
               isolation: Isolation = "auto", _policy_hook: bool = True) -> SandboxResult:
    """Run ``code`` in the sandbox and report what happened (never raises for the code's behaviour).

    ``files`` are written into the (otherwise empty) working directory first, e.g. data files.
    ``isolation``: "auto" uses namespaces when this machine allows them and otherwise falls back
    with a warning; "namespaces" refuses to run without them (status ``failed_to_start``); "none"
    runs without them (the result's ``layers`` says so). ``_policy_hook=False`` exists only so
    tests can check that the other layers hold on their own (defence in depth).
    """
    if isolation not in ("auto", "namespaces", "none"):
        raise ValueError(f"sandbox isolation {isolation!r}: expected 'auto', 'namespaces' or 'none'")
    limits = limits or SandboxLimits()
    python, uid = _interpreter_and_uid()
    bw, why_not = (None, "isolation='none' was requested") if isolation == "none" else _namespaces(python, uid)
    containment = _containment(bw, why_not, uid, _policy_hook, limits, python)
    if bw is None and isolation == "namespaces":
        return SandboxResult("failed_to_start", "", f"sandbox: namespaces unavailable: {why_not}", None, 0.0, [],
                             containment)
    if bw is None and isolation == "auto":
        _warn_without_namespaces(why_not)
    root = tempfile.mkdtemp(prefix="trajtune-sandbox-")
    try:
        work = _make_workdir(root, files or {}, uid)
        cmd = [python, "-I", "-c", _CHILD_PROGRAM]
        if bw is not None:
            cmd = bw.command(work) + cmd
        return _execute(cmd, code, limits, work, uid, containment, hook=_policy_hook, confined=bw is not None)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _execute(cmd: list[str], code: str, limits: SandboxLimits, work: str, uid: int | None,
             containment: dict[str, Any], *, hook: bool, confined: bool) -> SandboxResult:
    """Start the child, feed it the header and code, enforce the wall clock and output cap, collect."""
    token = secrets.token_hex(16)
    rr, rw = os.pipe()
    header = {"fd": rw, "token": token, "hook": hook, "mode": "namespaces" if confined else "none",
              "lost_exit": _CHANNEL_LOST_EXIT, "rlimits": _rlimits(limits)}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=work, env=_env(work), start_new_session=True, pass_fds=(rw,), close_fds=True,
                                **_identity(uid))
    except OSError as e:
        os.close(rr)
        return SandboxResult("failed_to_start", "", str(e), None, 0.0, [], containment)
    finally:
        os.close(rw)
    out, err, reports = bytearray(), bytearray(), bytearray()
    budget = [limits.max_output_bytes]
    over = threading.Event()
    kill = functools.partial(_kill_group, proc, confined)
    threads = [threading.Thread(target=_pump, args=(s, b, budget, over, kill), daemon=True)
               for s, b in ((proc.stdout, out), (proc.stderr, err))]
    threads.append(threading.Thread(target=_drain, args=(rr, reports), daemon=True))
    for t in threads:
        t.start()
    payload = (json.dumps(header) + "\n" + code).encode("utf-8", "surrogatepass")
    timed_out = _feed_and_wait(proc, payload, limits.wall_s, kill)
    if not confined:
        kill()  # stray members of its process group (under bwrap the PID namespace took them down)
    for t in threads:
        t.join(timeout=2.0)
    rc = proc.returncode
    if confined and rc is not None and 128 < rc <= 128 + 64:
        rc = -(rc - 128)  # bwrap reports a child killed by signal N as 128 + N
    violations = _parse_reports(bytes(reports), token)
    if hook and rc == _CHANNEL_LOST_EXIT:
        violations.append({"kind": "report_channel", "event": "lost",
                           "detail": "the policy hook refused an operation but its report channel had been "
                                     f"closed or replaced, so it ended the child (exit status {rc})"})
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    status = _classify(rc, timed_out, over.is_set(), stderr, violations)
    return SandboxResult(status, stdout, stderr, rc, time.monotonic() - start, violations, containment)


def _feed_and_wait(proc: subprocess.Popen, payload: bytes, wall_s: float, kill: Callable[[], None]) -> bool:
    """Give the child its header and code, and wait for it; True when the wall clock ran out first."""
    try:
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    try:
        proc.wait(timeout=wall_s)
        return False
    except subprocess.TimeoutExpired:
        kill()
        proc.wait()
        return True


def _drain(fd: int, sink: bytearray) -> None:
    """Read the report channel until every writer has closed it, keeping at most 1 MiB."""
    try:
        while chunk := os.read(fd, 65536):
            if len(sink) < _MAX_REPORT_BYTES:
                sink.extend(chunk[: _MAX_REPORT_BYTES - len(sink)])
    except OSError:
        pass
    finally:
        os.close(fd)


def _parse_reports(data: bytes, token: str) -> list[dict[str, str]]:
    """The hook's records (token-checked); any other line means the code wrote to the channel."""
    violations: list[dict[str, str]] = []
    forged = 0
    key = token.encode()
    for line in data.split(b"\n"):
        if not line:
            continue
        parts = line.split(b"\t")
        if len(parts) == 4 and hmac.compare_digest(parts[0], key):
            if len(violations) < _MAX_VIOLATIONS:
                kind, event, detail = (p.decode("utf-8", "replace") for p in parts[1:])
                violations.append({"kind": kind, "event": event, "detail": detail})
        else:
            forged += 1
    if forged:
        violations.append({"kind": "report_channel", "event": "forged",
                           "detail": f"{forged} line(s) on the report channel did not come from the policy hook"})
    return violations


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
    if any(v["kind"] == "report_channel" for v in violations):
        return "violation"  # the code tampered with the report channel: never "ok"
    if rc == 0:
        return "ok"  # refusals the code caught (e.g. an optional ``import ctypes``) stay listed in violations
    return "violation" if violations else "error"
