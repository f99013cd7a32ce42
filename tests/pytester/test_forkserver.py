"""The suite's fork server (tests/helpers/forkserver.py) gives a child Python what a new one gets: its
arguments, standard streams, working folder, environment and path, its exit status or signal, and a
``kill`` or ``terminate`` that reaches it; a child whose environment the server's imports could have
read differently, or a test marked ``fresh_python``, starts fresh."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import forkserver

PROBE = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "parent": os.getppid(), "path0": sys.path[0],
                  "seen": os.environ.get("LLMDET_PROBE"), "stdin": sys.stdin.read(),
                  "extra": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] in sys.path,
                  "torch": "torch" in sys.modules}))
sys.stderr.write("to stderr\\n")
sys.exit(int(sys.argv[1]))
"""


def serve_this_environment() -> None:
    """A second child pytest run of an environment starts its server (the first, if this one did not)."""
    for _ in range(2):
        subprocess.run([sys.executable, "-m", "pytest", "--version"], capture_output=True, check=True,
                       timeout=120)


def run(code: str, *args: str, **kwargs) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          **kwargs)
    return done, json.loads(done.stdout.splitlines()[0])


@pytest.mark.subprocess
def test_a_forked_child_is_the_command_it_was_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "extra"))
    serve_this_environment()
    monkeypatch.setenv("LLMDET_PROBE", "second")  # a variable no preloaded module reads: may differ
    done, seen = run(PROBE, "3", "two words", input="from stdin", cwd=tmp_path)
    assert seen["parent"] != os.getpid() and seen["torch"], "not a fork of the server"
    assert done.returncode == 3 and done.stderr == "to stderr\n"
    assert seen["argv"] == ["3", "two words"] and seen["stdin"] == "from stdin"
    assert seen["cwd"] == str(tmp_path) and seen["path0"] == "" and seen["extra"] and seen["seen"] == "second"


@pytest.mark.subprocess
def test_an_environment_the_imports_read_starts_fresh_and_so_does_a_fresh_python_test(monkeypatch):
    serve_this_environment()
    _, seen = run(PROBE, "0", input="")
    assert seen["parent"] != os.getpid()
    # OpenMP reads it as torch loads: another server's environment (a second pytest run would start it)
    monkeypatch.setenv("OMP_NUM_THREADS", f"{os.getpid()}")
    subprocess.run([sys.executable, "-m", "pytest", "--version"], capture_output=True, check=True,
                   timeout=120)
    _, seen = run(PROBE, "0", input="")
    assert seen["parent"] == os.getpid() and not seen["torch"]
    monkeypatch.delenv("OMP_NUM_THREADS")
    with forkserver.install().fresh():  # what the fresh_python marker does
        _, seen = run(PROBE, "0", input="")
    assert seen["parent"] == os.getpid() and not seen["torch"]


@pytest.mark.subprocess
@pytest.mark.parametrize("stop, status", [("terminate", -signal.SIGTERM), ("kill", -signal.SIGKILL)])
def test_a_forked_child_stops_when_its_command_is_stopped(tmp_path, stop, status):
    serve_this_environment()
    code = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(120)"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(process.stdout.readline())
    assert pid != process.pid  # a fork: its own pid, not the client's
    getattr(process, stop)()
    assert process.wait(timeout=30) == status
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


@pytest.mark.subprocess
def test_a_client_that_leaves_before_the_reply_leaves_no_child_and_the_server_serves_on():
    """The CI failure of 2026-12-07: a client killed as soon as its child printed had not read the reply
    with the child's pid; the server's reply then failed, the child was never registered and lived on
    (or the reset ended the server). Here each client leaves once its child has printed, unread reply
    and all, and one leaves before its request is whole."""
    serve_this_environment()
    _, path = forkserver.install().servers[forkserver._key(os.environ)]
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    request = {"command": forkserver.command_of([sys.executable, "-c", code]), "cwd": os.getcwd(),
               "env": dict(os.environ)}
    for _ in range(5):
        read, write = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn, os.fdopen(read) as output:
            conn.connect(path)
            socket.send_fds(conn, [json.dumps(request).encode()], [0, write, 2])
            os.close(write)
            assert int(output.readline()) > 0  # a child runs
            conn.close()  # its client is gone, its reply unread
            assert select.select([output], [], [], 30)[0] and output.read() == "", "the child lives on"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.connect(path)  # and leaves without a request
    _, seen = run(PROBE, "0", input="")
    assert seen["parent"] != os.getpid() and seen["torch"], "the server stopped serving"
