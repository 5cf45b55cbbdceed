"""Starting the services (`python -m sie_worker|sie_gateway|sie_config ...`) by forking one process that has already
imported them, instead of a new interpreter that imports torch and transformers again (4-8 s of CPU a worker).

The test suite starts well over a hundred of them. `python -m service_zygote SOCKET` imports the three services and
then waits on a Unix socket; for each launch it forks a child that sets up what a fresh `python -m <module> <args>`
would have (the environment, working directory, standard streams, argv, sys.path[0]) and runs the module as
`__main__`. The child is handed over to the process that asked, so that process waits for it, signals it and reads
its exit status exactly as it would a child it spawned (subprocess.Popen works unchanged): the zygote forks an
intermediate process that forks the service and exits, and the asker is a child subreaper (prctl) for that moment, so
the orphaned service is re-parented to it.

Only a launch whose environment matches the zygote's could be forked: libraries read some variables once, at import
(Hugging Face's cache and offline settings, OpenMP's), so a launch that differs from the zygote's environment in any
variable but the ones only read later (the services' settings, SIE_*; AWS_*, read when a client is made) is spawned
as usual. So is one that asks for what a fork cannot give (a new session or process group, other users, kept fds).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MODULES = ("sie_worker", "sie_gateway", "sie_config")
# Variables nothing reads before the service's own start-up code (its settings), or at all in a service.
LATE_PREFIXES = ("SIE_", "AWS_", "PYTEST_")
_PR_SET_CHILD_SUBREAPER = 36
_MAX_REQUEST = 1 << 20
# How long a launch waits for the zygote's answer (a fork takes milliseconds; a busy machine, seconds).
_REPLY_TIMEOUT_S = 120
# subprocess.Popen._execute_child's arguments after `self` and `args` (Python 3.11 to 3.13).
_EXECUTE_CHILD_ARGUMENTS = 22


def _late(name: str) -> bool:
    return name.startswith(LATE_PREFIXES)


def _early(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if not _late(name)}


# --- the zygote ----------------------------------------------------------------------------------------------------


Changes = dict[str, tuple[str | None, str | None]]


def serve(socket_path: str) -> Callable[[], None] | None:
    """Import the services, then fork one for each request on `socket_path` until the parent goes. Returns, in a
    forked service only, what turns it into the service: run with nothing of the zygote's loop on the stack, so the
    service's exit (SystemExit, an uncaught exception, Ctrl-C) is the interpreter's, as in a fresh process."""
    environ = dict(os.environ)
    for module in MODULES:
        __import__(f"{module}.server")
    gc.freeze()  # the imported objects stay shared with the children (the collector does not touch their pages)
    imported = _changes(environ, dict(os.environ))
    parent = os.getppid()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(socket_path)
        listener.listen(16)
        listener.settimeout(1.0)
        print(json.dumps({"environ": environ}), flush=True)
        while os.getppid() == parent:
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(None)
                service = _fork_one(connection, imported)
            if service is not None:
                return service
    return None


def _changes(before: Mapping[str, str], after: Mapping[str, str]) -> Changes:
    """Variable -> (value before, value after) for each one that differs."""
    return {
        name: (before.get(name), after.get(name))
        for name in before.keys() | after.keys()
        if before.get(name) != after.get(name)
    }


def _fork_one(connection: socket.socket, imported: Changes) -> Callable[[], None] | None:
    """Fork the requested service through an intermediate process that exits once it has sent the service's pid
    (the asker, a child subreaper meanwhile, becomes the service's parent). What the service runs, in the service."""
    message, fds, _, _ = socket.recv_fds(connection, _MAX_REQUEST, 3)
    request = json.loads(message)
    intermediate = os.fork()
    if intermediate == 0:
        service = os.fork()
        if service == 0:
            return functools.partial(_become, request, fds, imported)
        try:
            connection.sendall(json.dumps({"pid": service}).encode())
        finally:
            os._exit(0)
    for fd in fds:
        os.close(fd)
    os.waitpid(intermediate, 0)
    return None


def child_environment(requested: Mapping[str, str], imported: Changes) -> dict[str, str]:
    """`requested`, with each variable the zygote's imports changed changed the same way where `requested` has the
    value the imports found (they would have done the same in a fresh process)."""
    env = dict(requested)
    for name, (before, after) in imported.items():
        if env.get(name) == before:
            if after is None:
                env.pop(name, None)
            else:
                env[name] = after
    return env


def _become(request: dict, fds: list[int], imported: Changes) -> None:
    """Run `python -m <module> <args>` in this forked child with the request's environment (child_environment),
    working directory and standard streams."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(child_environment(request["env"], imported))
    sys.path[0] = request["cwd"]
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


# --- the asker -----------------------------------------------------------------------------------------------------


class Zygote:
    """A zygote of this process's, started on first use, stopped by `stop`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subreaper_users = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._socket_path = ""
        self._environ: dict[str, str] = {}

    def execute_child(self, popen: subprocess.Popen, args: Any, *rest: Any) -> bool:
        """subprocess.Popen._execute_child's work (its arguments after `self`) done by a fork of the zygote, when
        `args` is `python -m <service> ...` and nothing asks for what a fork could not give; False if not done."""
        if len(rest) != _EXECUTE_CHILD_ARGUMENTS:  # another Python's Popen: spawn
            return False
        (executable, preexec_fn, _close_fds, pass_fds, cwd, env, _startupinfo, _creationflags, shell,
         p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, _restore_signals,
         gid, gids, uid, umask, start_new_session, process_group) = rest  # fmt: skip
        argv = [os.fspath(arg) for arg in args] if isinstance(args, (list, tuple)) else []
        if (
            len(argv) < 3
            or argv[0] != sys.executable
            or argv[1] != "-m"
            or argv[2] not in MODULES
            or shell
            or executable not in (None, sys.executable)
            or preexec_fn is not None
            or pass_fds
            or start_new_session
            or process_group not in (None, -1)
            or (gid, gids, uid) != (None, None, None)
            or umask not in (None, -1)
        ):
            return False
        streams = [fd if fd != -1 else default for fd, default in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2))]
        environ = dict(os.environ if env is None else env)
        pid = self._launch(argv[2], argv[3:], environ, None if cwd is None else os.fspath(cwd), streams)
        if pid is None:
            return False
        popen.pid = pid
        popen._child_created = True  # type: ignore[attr-defined]
        popen._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]
        return True

    def _launch(
        self, module: str, args: Sequence[str], env: dict[str, str], cwd: str | None, streams: Sequence[int]
    ) -> int | None:
        """Fork `python -m module args` with standard streams `streams`; its pid, a child of this process, or None
        when `env` differs from this process's environment in a variable read at import."""
        with self._lock:
            self._start()
            if _early(self._environ) != _early(env):
                if _early(env) != _early(os.environ) or self._subreaper_users:  # a variable of its own: spawn
                    return None
                # This process's own environment changed since the zygote started (a library set a variable):
                # a zygote with the new one, once no launch is being handed over by the old one.
                self._stop()
                self._start()
            self._subreaper_users += 1
            if self._subreaper_users == 1:
                _set_subreaper(True)
        try:
            request = {"module": module, "args": list(args), "env": env, "cwd": cwd or os.getcwd()}
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(_REPLY_TIMEOUT_S)  # a zygote that stopped answering fails the launch
                try:
                    connection.connect(self._socket_path)
                except (FileNotFoundError, ConnectionRefusedError):  # the zygote has gone: nothing was forked
                    return None
                socket.send_fds(connection, [json.dumps(request).encode()], list(streams))
                reply = b""
                while chunk := connection.recv(4096):
                    reply += chunk
            # The zygote closes the connection once the intermediate process has exited: the service is ours now.
            pid = int(json.loads(reply)["pid"])
        finally:
            with self._lock:
                self._subreaper_users -= 1
                if self._subreaper_users == 0:
                    _set_subreaper(False)
        if _parent_of(pid) != os.getpid():
            raise RuntimeError(f"the forked {module} ({pid}) was not handed over to this process")
        return pid

    def _start(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        directory = tempfile.mkdtemp(prefix="sie-zygote-")
        self._socket_path = str(Path(directory) / "socket")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "service_zygote", self._socket_path],
            env=dict(os.environ),  # this mapping, not the C library's environment (which ncurses may have added to)
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the service zygote exited with {self._process.wait()}")
        self._environ = json.loads(line)["environ"]

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        self._process.wait()
        assert self._process.stdout is not None
        self._process.stdout.close()
        self._process = None
        Path(self._socket_path).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            Path(self._socket_path).parent.rmdir()


def _parent_of(pid: int) -> int:
    """The parent pid of `pid` (/proc/PID/stat: the field after the parenthesised name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


if __name__ == "__main__":
    become = serve(sys.argv[1])
    if become is not None:
        become()
