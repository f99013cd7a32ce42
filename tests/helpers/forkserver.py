"""A fork server for the child Pythons the suite starts: ``python -m pytest``, ``python -m
pytest_llmdeterminism.cli``, ``python -c CODE`` (xdist's workers among them) and ``python SCRIPT.py``
begin as a fork of a Python that has already imported pytest, torch and transformers, and computed
nothing.

Why: the suite starts ~300 child Pythons, and a child run of a small project spends most of its time
starting: measured on the 2-core AMD EPYC, a one-test run of the tiny model takes 5.3 CPU s, ~3.5 of
them importing torch and transformers. What a fork shares is only those imports. The plugin, the
project's conftest and test modules, the model and every computation are the child's own, as in a fresh
process; torch has run no kernel, so no OpenMP pool or CPU-capability choice is inherited (the server
checks that its imports started no thread besides numpy's and scipy's OpenBLAS pools, which stop
themselves at a fork). A child's environment is set whole before its run, but what the imports read from
it when the server started is fixed: a request is served only when every variable outside ``MAY_DIFFER``
equals the server's, and each distinct environment gets its own server (at the second child pytest run
that asks for it; at most ``SERVERS`` at once per process, the least recently used retiring once its
children ended). Anything else runs as written (a new Python): another command or ``executable``, a
``preexec_fn``, a test marked ``fresh_python`` (it tests what a new process imports), the suite's own
xdist workers, or every child with ``LLMDET_TEST_FORKSERVER=0``. A forked child's own children (a child
run's xdist workers, a benchmark's runs) are forks of the same server.

The command the caller gets is a real process: a small client (``python -I -S`` this file, ~20 ms)
that hands its standard streams, working folder, environment and arguments to the server, waits for
the child's exit status and ends with it (by the same signal, if the child died of one). Its
``terminate`` reaches the child; its ``kill`` closes its connection, on which the server kills the
child's process group (a client that ends before it read its reply included: Linux reports that end
as a reset). If the server is gone or refuses, the client runs the command itself.

Long: the interception, the server and its client are one protocol, read together.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import inspect
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# What a child run of this suite imports before it runs anything (3-4 CPU s natively).
PRELOAD = ("pytest", "numpy", "torch", "transformers", "transformers.models.llama.modeling_llama",
           "transformers.models.llama.configuration_llama", "tokenizers", "safetensors.torch", "xxhash",
           "huggingface_hub", "gguf", "llama_cpp")
MODULES = ("pytest", "pytest_llmdeterminism.cli")  # what `python -m MODULE` the server runs
# Variables no preloaded module reads while it is imported: a child may set them to anything. HOME
# (pytester gives each test its own) is one: the Hugging Face hub's default cache folder is the one
# thing read from it at import, and a run that uses the hub names its cache (HF_HUB_CACHE differs).
MAY_DIFFER = ("HOME", "USERPROFILE", "PWD", "OLDPWD", "CI", "COLUMNS", "LINES", "PYTHONPATH", "_")
MAY_DIFFER_PREFIXES = ("PYTEST_", "LLMDET_")
SERVERS = 6  # servers a process holds at most (~400 MB each): a new one retires the least recently used
ENABLED = os.environ.get("LLMDET_TEST_FORKSERVER", "1") != "0"
LOG = os.environ.get("LLMDET_TEST_FORKSERVER_LOG")


def _forkable_variable(name: str) -> bool:
    return name in MAY_DIFFER or name.startswith(MAY_DIFFER_PREFIXES)


def _key(environment: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, value) for name, value in environment.items() if not _forkable_variable(name)))


def command_of(args: Sequence[Any]) -> dict[str, Any] | None:
    """What ``args`` (a command line of ``sys.executable``) runs, if the server can run it: ``python
    [-u] -m MODULE`` (one of MODULES), ``python [-u] -c CODE`` (as xdist starts its workers) or
    ``python [-u] SCRIPT.py``; each with its arguments."""
    if len(args) < 2 or os.fspath(args[0]) != sys.executable:
        return None
    rest = [os.fspath(arg) for arg in args[1:]]
    unbuffered = rest[0] == "-u"
    rest = rest[1:] if unbuffered else rest
    if not rest:
        return None
    first, found = rest[0], None
    if first in ("-m", "-c") and len(rest) > 1:
        found = {"mode": first, "target": rest[1], "args": rest[2:]}
    elif first.startswith(("-m", "-c")) and len(first) > 2:
        found = {"mode": first[:2], "target": first[2:], "args": rest[1:]}
    elif first.endswith(".py") and os.path.isfile(first):
        found = {"mode": "script", "target": first, "args": rest[1:]}
    if found is None or (found["mode"] == "-m" and found["target"] not in MODULES):
        return None
    return {**found, "unbuffered": unbuffered}


class Servers:
    """This process's fork servers, one per environment, started when an environment is asked for twice."""

    def __init__(self, served: tuple[tuple[tuple[str, str], ...], str] | None = None) -> None:
        """``served``: in a forked child, the environment and socket of the server it was forked from
        (the one server it uses: it starts none)."""
        self.servers: dict[tuple[tuple[str, str], ...], tuple[subprocess.Popen[bytes] | None, str]] = {}
        if served is not None:
            self.servers[served[0]] = (None, served[1])
        self.may_start = served is None
        # The suite's own process forks only for its tests (not the xdist workers its controller starts);
        # a forked child, for whatever it starts (a child run's xdist workers too).
        self.in_tests_only = served is None
        self.folder = tempfile.mkdtemp(prefix="llmdet-forkserver-") if self.may_start else ""
        self.asked: set[tuple[tuple[str, str], ...]] = set()
        self.started = 0
        self.fresh_python = 0  # > 0 while a test that must start fresh Pythons runs

    def serving(self) -> bool:
        """Whether a child Python started now may be a fork."""
        return not self.fresh_python and (not self.in_tests_only or "PYTEST_CURRENT_TEST" in os.environ)

    def socket_for(self, environment: Mapping[str, str], command: dict[str, Any]) -> str | None:
        """The socket of the server for ``environment``, started if needed; None: run as written.
        Only a second child pytest run of an environment starts a server: the other commands (the CLI,
        scripts) often import no torch, and start in a fraction of the server's ~4 CPU s."""
        key = _key(environment)
        if key in self.servers:
            server, path = self.servers.pop(key)
            self.servers[key] = (server, path)  # the most recently used last
            return path if server is None or server.poll() is None else None
        starts = command["mode"] == "-m" and command["target"] == "pytest"
        if not self.may_start or not starts or key not in self.asked:
            if starts:
                self.asked.add(key)
            return None
        if len(self.servers) >= SERVERS:
            retired, _ = self.servers.pop(next(iter(self.servers)))
            if retired is not None and retired.poll() is None:
                retired.send_signal(signal.SIGHUP)  # takes no new child; ends when its children have
        self.started += 1
        path = os.path.join(self.folder, f"{self.started}.socket")
        started = {name: value for name, value in environment.items() if name != "PYTHONPATH"}
        with self.fresh():
            server = subprocess.Popen([sys.executable, __file__, "serve", path], env=started, cwd=self.folder,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        self.servers[key] = (server, path)
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return path if os.path.exists(path) else None

    def stop(self) -> None:
        for server, _ in self.servers.values():
            if server is not None and server.poll() is None:
                server.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=5)
        self.servers.clear()

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
        """Child Pythons started in the block are new processes (a test of what a process imports)."""
        self.fresh_python += 1
        try:
            yield
        finally:
            self.fresh_python -= 1


_EXECUTE_CHILD = subprocess.Popen._execute_child  # type: ignore[attr-defined]
_SIGNATURE = inspect.signature(_EXECUTE_CHILD)


def _execute_child(*args: Any, **kwargs: Any) -> Any:
    """``subprocess.Popen``'s own start, with a forkable command given to the fork server's client."""
    bound = _SIGNATURE.bind(*args, **kwargs)
    call = bound.arguments
    servers: Servers = _execute_child.servers  # type: ignore[attr-defined]
    command = command_of(call["args"]) if isinstance(call["args"], (list, tuple)) else None
    if (command is not None and servers.serving() and not call["shell"] and call["executable"] is None
            and call["preexec_fn"] is None and not call["pass_fds"]):
        environment = os.environ if call["env"] is None else call["env"]
        path = servers.socket_for({os.fsdecode(k): os.fsdecode(v) for k, v in environment.items()}, command)
        if path is not None:
            call["args"] = [sys.executable, "-I", "-S", __file__, "client", path,
                            *map(os.fspath, call["args"][1:])]
    if LOG and isinstance(call["args"], (list, tuple)) and os.fspath(call["args"][0]) == sys.executable:
        with open(LOG, "a") as log:  # which children were forks (LLMDET_TEST_FORKSERVER_LOG=FILE)
            head = [str(arg)[:60] for arg in call["args"][:4]]
            print(json.dumps({"fork": head[1] == "-I", "args": head,
                              "test": os.environ.get("PYTEST_CURRENT_TEST", "")[:120]}), file=log)
    return _EXECUTE_CHILD(*bound.args, **bound.kwargs)


def install(served: tuple[tuple[tuple[str, str], ...], str] | None = None) -> Servers | None:
    """Serve this process's forkable child Pythons from fork servers (stopped at exit); ``served``: as
    :class:`Servers` takes it. Once per process, whichever copy of this module asks (the server runs
    it as ``__main__``): a later call gets the servers the first one installed."""
    current = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    if hasattr(current, "servers"):
        return current.servers  # type: ignore[no-any-return]
    if not ENABLED or sys.platform != "linux":
        return None
    _execute_child.servers = Servers(served)  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = _execute_child  # type: ignore[attr-defined]
    atexit.register(_execute_child.servers.stop)  # type: ignore[attr-defined]
    return _execute_child.servers  # type: ignore[attr-defined,no-any-return]


# ---- the server ------------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Listen first (the client waits in the backlog), import PRELOAD, then fork a child per request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(8)
    os.rename(path + ".tmp", path)
    parent = os.getppid()
    base = sys.path[1:]  # without this file's folder; PYTHONPATH was not given to the server
    served = (_key(os.environ), path)
    # numpy's OpenBLAS, and scipy's own (loaded by scipy.linalg, which transformers' modeling imports
    # where scipy is installed), start their threads when they load and stop them at a fork (their
    # fork handlers, restarting them when the child computes: verified); any other thread would be
    # copied half-way: refused.
    import numpy  # noqa: F401

    with contextlib.suppress(ImportError):
        import scipy.linalg  # noqa: F401
    blas_threads = len(os.listdir("/proc/self/task"))
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    refusal = f"{threads - blas_threads} threads started while importing" if threads != blas_threads else None
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    retiring: list[bool] = []
    signal.signal(signal.SIGHUP, lambda *_: retiring.append(True))
    children: dict[int, socket.socket] = {}
    stopped: set[int] = set()  # children killed because their client ended, not yet reaped
    try:
        while os.getppid() == parent and not (retiring and not children):
            if retiring and listener.fileno() != -1:
                listener.close()
                os.unlink(path)
            listening = [listener] if listener.fileno() != -1 else []
            clients = [conn for pid, conn in children.items() if pid not in stopped]
            ready, _, _ = select.select([*listening, wake_read, *clients], [], [], 1.0)
            if wake_read in ready:
                os.read(wake_read, 512)
            _reap(children, stopped)
            for pid, conn in list(children.items()):
                if conn in ready and pid not in stopped and _client_gone(conn):  # so is its child
                    stopped.add(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
            if listener in ready:
                conn, _ = listener.accept()
                inherited = [listener, wake_read, wake_write, *children.values()]
                pid = _start(conn, inherited, base, served, refusal)
                if pid is None:
                    conn.close()
                else:  # registered even if the client already left: the next select finds it gone
                    children[pid] = conn
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _client_gone(conn: socket.socket) -> bool:
    """Whether the client at ``conn`` ended. A client killed before it read the reply carrying its
    child's pid leaves that reply unread, and Linux then reports the end as ECONNRESET, not as EOF."""
    try:
        return not conn.recv(16, socket.MSG_PEEK)
    except OSError:
        return True


def _reap(children: dict[int, socket.socket], stopped: set[int]) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        stopped.discard(pid)
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
            conn.close()


def _start(conn: socket.socket, inherited: list[Any], base: list[str],
           served: tuple[tuple[tuple[str, str], ...], str], refusal: str | None) -> int | None:
    """Fork the child ``conn``'s client asks for and return its pid; None: no child (refused, or the
    client left before its request was whole)."""
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(message)
    except (OSError, ValueError):
        return None
    if refusal is not None or len(fds) != 3:
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"fresh": refusal or "no standard streams"}).encode())
        for fd in fds:
            os.close(fd)
        return None
    pid = os.fork()
    if pid:
        # Its own process group from this instant (the child sets it too): a kill for a client that
        # ends at once must reach it. The client may be gone already (it was killed as soon as the
        # child printed): then the reply fails, and the caller's next look finds the client gone.
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"pid": pid}).encode())
        return pid
    try:  # the child: becomes the command it was asked for
        conn.close()
        for item in inherited:
            item.close() if isinstance(item, socket.socket) else os.close(item)
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        command = request["command"]
        _standard_streams(unbuffered=command["unbuffered"])
        extra = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[:] = [_first_path_entry(command), *extra, *base]
        install(served)  # its own children are forks of this server too
        code = _run(command)
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def _first_path_entry(command: dict[str, Any]) -> str:
    if command["mode"] == "script":
        return os.path.dirname(os.path.realpath(command["target"]))
    return os.getcwd() if command["mode"] == "-m" else ""


def _standard_streams(*, unbuffered: bool) -> None:
    """New sys.stdin, stdout and stderr over the descriptors the client gave, as a new Python makes them."""
    import io

    def stream(fd: int, old: Any) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        buffered: Any = io.BufferedReader(raw) if fd == 0 else raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding=old.encoding, errors=old.errors,
                                line_buffering=fd == 2 or (fd == 1 and raw.isatty()),
                                write_through=unbuffered and fd != 0)

    sys.stdin = sys.__stdin__ = stream(0, sys.__stdin__)
    sys.stdout = sys.__stdout__ = stream(1, sys.__stdout__)
    sys.stderr = sys.__stderr__ = stream(2, sys.__stderr__)


def _run(command: dict[str, Any]) -> int:
    """Run ``command`` as ``python`` runs it, ending as the interpreter ends (threads, then atexit)."""
    import runpy
    import threading
    import types

    mode, target = command["mode"], command["target"]
    try:
        if mode == "-m":
            sys.argv = ["-m", *command["args"]]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif mode == "script":
            sys.argv = [target, *command["args"]]
            runpy.run_path(target, run_name="__main__")
        else:
            sys.argv = ["-c", *command["args"]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as end:
        if end.code is None or isinstance(end.code, int):
            code = end.code or 0
        else:
            print(end.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


# ---- the client ------------------------------------------------------------------------------------


def client(path: str, argv: list[str]) -> None:
    """Have the server at ``path`` run ``python ARGV`` here; end as it ends. Without a server, exec it."""
    request = {"command": command_of([sys.executable, *argv]), "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        reply = json.loads(conn.recv(1 << 16) or b'{"fresh": "the server ended"}')
    except OSError as error:
        reply = {"fresh": str(error)}
    if "fresh" in reply:
        os.execv(sys.executable, [sys.executable, *argv])
    pid = reply["pid"]
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda received, _: os.kill(pid, received))
    answer = conn.recv(1 << 16)
    status = json.loads(answer)["status"] if answer else 1
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3:])
