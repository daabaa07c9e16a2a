"""Adversarial tests: each attack is contained and reported as what it is.

Limits are tight on purpose (the test machine is shared): 1 s CPU, 2 s wall, 256 MB, 8 processes.
"""

from __future__ import annotations

import os
import time

import pytest

from trajtune.sandbox import SandboxLimits, run_python

TIGHT = SandboxLimits(cpu_s=1, wall_s=2.0, memory_mb=256, file_size_mb=1, nproc=8, max_output_bytes=10_000)


def run(code: str, **kw) -> object:
    return run_python(code, TIGHT, **kw)


def test_ordinary_code_runs_and_can_use_its_workdir():
    r = run("open('a.txt', 'w').write('hi')\nimport math, json, fractions\nprint(open('a.txt').read(), math.isqrt(49))")
    assert r.status == "ok" and r.stdout == "hi 7\n" and r.violations == [] and r.exit_code == 0


def test_workdir_starts_empty_and_files_are_provided():
    r = run("import os\nprint(sorted(os.listdir('.')))", files={"data.csv": "x\n1\n"})
    assert r.stdout.strip() == "['data.csv']"
    with pytest.raises(ValueError):
        run("pass", files={"../escape.txt": "x"})


def test_exception_is_an_error_with_traceback():
    r = run("1/0")
    assert r.status == "error" and "ZeroDivisionError" in r.stderr and r.exit_code == 1
    assert "ZeroDivisionError" in r.observation()


def test_infinite_loop_hits_cpu_limit():
    # a generous wall clock so the CPU limit (1 s of CPU) fires first even on a loaded machine
    limits = SandboxLimits(cpu_s=1, wall_s=20.0, memory_mb=256, file_size_mb=1, nproc=8)
    r = run_python("while True: pass", limits)
    assert r.status == "cpu_limit" and r.duration_s < 20


def test_sleeping_forever_hits_wall_clock_timeout():
    t0 = time.monotonic()
    r = run("import time\nprint('start', flush=True)\nwhile True: time.sleep(0.1)")
    assert r.status == "timeout" and r.stdout == "start\n" and time.monotonic() - t0 < 4


def test_fork_bomb_is_refused():
    r = run("import os\nwhile True: os.fork()")
    assert r.status == "violation" and r.violation_kinds == {"process"}


def test_fork_bomb_contained_by_process_limit_even_without_policy_hook():
    # Defence in depth: with the audit hook off, RLIMIT_NPROC still stops the bomb.
    code = ("import os, time\nn = 0\nfor i in range(40):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(0.5); os._exit(0)\n    n += 1\nprint(n)")
    r = run(code, _policy_hook=False)
    assert r.status == "ok" and int(r.stdout) < TIGHT.nproc


def test_memory_bomb_hits_address_space_limit():
    r = run("x = []\nwhile True: x.append(bytearray(10**7))")
    assert r.status == "memory_limit" and "MemoryError" in r.stderr


def test_disk_fill_hits_file_size_limit():
    r = run("f = open('big', 'wb')\nwhile True: f.write(b'x' * 65536)")
    assert r.status == "file_size_limit"


def test_network_connect_is_refused():
    r = run("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))")
    assert r.status == "violation" and r.violation_kinds == {"network"}


def test_network_namespace_blocks_even_without_policy_hook():
    r = run("import socket\ns = socket.socket()\ns.settimeout(1)\n"
            "try:\n    s.connect(('1.1.1.1', 80)); print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e.errno)",
            _policy_hook=False)
    if r.containment["network"].startswith("netns"):
        assert r.stdout.startswith("blocked")
    else:  # no namespace on this kernel: the policy hook is the only layer, and it is on by default
        assert run("import socket\nsocket.socket()").violation_kinds == {"network"}


def test_read_outside_workdir_is_refused():
    r = run("print(open('/etc/hostname').read())")
    assert r.status == "violation" and r.violation_kinds == {"filesystem_read"} and r.stdout == ""
    r = run("import os\nprint(os.listdir('/'))")
    assert r.violation_kinds == {"filesystem_read"}


def test_write_outside_workdir_is_refused(tmp_path):
    target = tmp_path / "pwned.txt"
    r = run(f"open({str(target)!r}, 'w').write('x')")
    assert r.status == "violation" and r.violation_kinds == {"filesystem_write"}
    assert not target.exists()
    r = run("open('../escape.txt', 'w').write('x')")
    assert r.violation_kinds == {"filesystem_write"}


def test_spawning_a_subprocess_is_refused():
    for code in ("import subprocess\nsubprocess.run(['ls'])", "import os\nos.system('ls')",
                 "import os\nos.execv('/bin/ls', ['ls'])"):
        r = run(code)
        assert r.status == "violation" and r.violation_kinds == {"process"}, code


def test_signalling_the_parent_is_refused():
    r = run("import os\nos.kill(os.getppid(), 9)")
    assert r.status == "violation" and r.violation_kinds == {"signal"}
    r = run(f"import os\nos.kill({os.getpid()}, 15)")
    assert r.violation_kinds == {"signal"}


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("TRAJTUNE_TEST_SECRET", "hunter2")
    r = run("import os\nprint(dict(os.environ))")
    assert r.status == "ok" and "hunter2" not in r.stdout and "TRAJTUNE_TEST_SECRET" not in r.stdout
    r = run(f"print(open('/proc/{os.getpid()}/environ').read())")
    assert r.violation_kinds == {"filesystem_read"} and "hunter2" not in r.stdout


def test_native_code_is_refused():
    r = run("import ctypes")
    assert r.status == "violation" and r.violation_kinds == {"native_code"}


def test_output_is_capped():
    r = run("while True: print('y' * 1000)")
    assert r.status == "output_limit" and len(r.stdout) <= TIGHT.max_output_bytes


def test_no_temp_dirs_are_left_behind():
    import tempfile
    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("trajtune-sandbox-")}
    run("open('x', 'w').write('1')")
    after = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("trajtune-sandbox-")}
    assert after <= before


def test_limits_are_in_force_inside_the_child():
    r = run("import resource, os\nprint(resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20, "
            "resource.getrlimit(resource.RLIMIT_CPU), resource.getrlimit(resource.RLIMIT_NPROC)[0], os.getcwd() != '/')")
    assert r.status == "ok", r.stderr
    assert r.stdout.split()[0] == "256" and "(1, 2)" in r.stdout and " 8 " in r.stdout and r.stdout.strip().endswith("True")


def test_sandbox_is_safe_to_call_from_threads():
    # environments call the sandbox from step_batch's worker threads
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: run(f"print({i} * {i})").stdout.strip(), range(6)))
    assert outs == [str(i * i) for i in range(6)]
