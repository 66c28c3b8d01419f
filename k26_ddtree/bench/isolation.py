"""Where the coding eval runs model-written code: inside bubblewrap, or, only when the user
opts in, in a plain process. Model output is untrusted input: it never runs as root.

bubblewrap (`bwrap`, the Debian/Ubuntu package `bubblewrap`) gives the code new pid, network,
ipc and uts namespaces (and a user namespace when the caller is not root), a root holding
only the system directories and the interpreter, all read-only, a private size-capped /tmp
and /work (its cwd), no /proc, no environment, --die-with-parent and --new-session, and the
seccomp filter of `seccomp.py`. Run as root, bwrap keeps only the capabilities to change
uid, and `setpriv` makes the command uid nobody without capabilities before Python starts:
bwrap mounts the interpreter first, so one in a home nobody cannot enter (a pyenv build
under /root) still runs, while root-only files stay closed.

Without a working bwrap the eval refuses, unless the user passes --eval-unsandboxed; then
the code runs in a plain process with the runner's rlimits, as uid nobody when the caller is
root (an interpreter nobody can run is required, else it still refuses).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.bench.seccomp import deny_filter
from k26_ddtree.errors import UserError

NOBODY = 65534
WORKDIR = "/work"
TMPFS_BYTES = 64 * 1024 * 1024
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_PYTHON = "/usr/bin/python3"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
PROBE_TIMEOUT_S = 30.0
# Writes in its cwd and reports who it is and whose standard library it loaded.
PROBE = "import os; open('probe', 'w').write('ok'); print(os.getuid(), os.path.dirname(os.__file__))"
UNSANDBOXED_FLAG = "--eval-unsandboxed"


@dataclass(frozen=True)
class Interpreter:
    path: str  # resolved executable
    tree: str | None  # its installation, mounted read-only; None when it lives under /usr

    def argv(self) -> list[str]:
        return [self.path, "-I", "-S"]


def interpreters() -> list[Interpreter]:
    """This interpreter, resolved (a venv's link may lead into a home), then the system's python3
    (the tasks are stdlib-only, so any Python 3 can grade them)."""
    own = os.path.realpath(sys.executable)
    tree = os.path.realpath(sys.base_prefix)
    found = [Interpreter(own, None if _under(tree, "/usr") else tree)]
    system = os.path.realpath(SYSTEM_PYTHON)
    if os.path.isfile(system) and system != own:
        found.append(Interpreter(system, None))
    return found


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _drop_to_nobody(consequence: str = "") -> tuple[str, ...]:
    """setpriv's command prefix that runs the rest as uid nobody without capabilities; an
    _Unusable (its message ending in `consequence`) when setpriv is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise _Unusable(f"setpriv (util-linux) is missing{consequence}")
    return (os.path.realpath(setpriv), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--")


def _bwrap_mounts(python: Interpreter) -> list[str]:
    argv = ["--ro-bind", "/usr", "/usr"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    # bwrap makes missing parents of a mount 0700; nobody must pass them.
    argv += ["--perms", "0755", "--dir", "/etc", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    if python.tree:
        for parent in reversed(Path(python.tree).parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", python.tree, python.tree]
    size = str(TMPFS_BYTES)
    return argv + ["--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
                   "--perms", "0777", "--size", size, "--tmpfs", WORKDIR, "--chdir", WORKDIR]


@dataclass(frozen=True)
class Isolation:
    """One way to start the interpreter for model-written code; `note` goes into the results."""

    note: str
    python: Interpreter
    uid: int  # the uid the code runs as
    wrapper: tuple[str, ...]  # bwrap and its options; () for a plain process
    drop: tuple[str, ...]  # setpriv to uid nobody, or ()

    def command(self, argv: list[str], seccomp_fd: int | None) -> list[str]:
        if not self.wrapper:
            return [*self.drop, *argv]
        seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        return [*self.wrapper, *seccomp, "--", *self.drop, *argv]

    @contextlib.contextmanager
    def started(self, argv: list[str], pass_fds: tuple[int, ...] = (), **popen):
        """Popen of `argv` inside; on leaving, its whole process group is killed and reaped."""
        with self._workdir() as cwd, self._seccomp_fd() as seccomp_fd:
            fds = pass_fds + ((seccomp_fd,) if seccomp_fd is not None else ())
            proc = subprocess.Popen(self.command(argv, seccomp_fd), cwd=cwd, pass_fds=fds, env=ENV,
                                    start_new_session=True, **popen)
            try:
                yield proc
            finally:
                # The group, not the pid: code outside bubblewrap may have left children behind.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    @contextlib.contextmanager
    def _workdir(self):
        if self.wrapper:
            yield "/"  # bwrap makes /work itself
            return
        with tempfile.TemporaryDirectory(prefix="k26-sandbox-", ignore_cleanup_errors=True) as path:
            if self.uid != os.geteuid():
                os.chown(path, self.uid, self.uid)
            yield path

    @contextlib.contextmanager
    def _seccomp_fd(self):
        program = deny_filter() if self.wrapper else None
        if program is None:
            yield None
            return
        fd = os.memfd_create("k26-seccomp")
        try:
            os.write(fd, program)
            os.lseek(fd, 0, os.SEEK_SET)
            yield fd
        finally:
            os.close(fd)


def _bubblewrap(bwrap: str, python: Interpreter) -> Isolation:
    as_root = os.geteuid() == 0
    if as_root:
        drop = _drop_to_nobody(", so bwrap cannot drop root")
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                      "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                      "--cap-add", "CAP_SETPCAP"]
    else:
        namespaces, drop = ["--unshare-all"], ()  # a user namespace too: bwrap needs one to mount
    uid = NOBODY if as_root else os.getuid()
    filtered = "a seccomp filter" if deny_filter() is not None else "no seccomp filter (unknown machine)"
    note = (f"bubblewrap: uid {uid}, no network, own pid/ipc/uts namespaces, read-only system dirs and "
            f"interpreter only, private /tmp and /work, no /proc, {filtered}, rlimits")
    wrapper = (bwrap, *namespaces, "--die-with-parent", "--new-session", "--clearenv",
               *(arg for key, value in {**ENV, "HOME": WORKDIR}.items() for arg in ("--setenv", key, value)),
               *_bwrap_mounts(python))
    return Isolation(note, python, uid, wrapper, drop)


def _unsandboxed(python: Interpreter) -> Isolation:
    if os.geteuid() != 0:
        uid = os.getuid()
        return Isolation(f"UNSANDBOXED ({UNSANDBOXED_FLAG}): a plain process as uid {uid} with rlimits; "
                         f"it can read and write what uid {uid} can", python, uid, (), ())
    drop = _drop_to_nobody()
    return Isolation(f"UNSANDBOXED ({UNSANDBOXED_FLAG}): a plain process as uid {NOBODY} with rlimits; "
                     f"it can read and write what uid {NOBODY} can", python, NOBODY, (), drop)


class _Unusable(Exception):
    """Why a kind of isolation cannot work on this machine."""


def _probe(isolation: Isolation) -> str | None:
    """None when the interpreter starts inside, writes its cwd and runs as the intended uid; else why not."""
    argv = [*isolation.python.argv(), "-c", PROBE]
    try:
        with isolation.started(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) as proc:
            out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer within {PROBE_TIMEOUT_S:g}s"
    except OSError as err:
        return f"cannot start it: {err.strerror}"
    words = out.decode(errors="replace").split()
    stdlib_root = isolation.python.tree or "/usr"
    if proc.returncode == 0 and len(words) == 2 and words[0] == str(isolation.uid) and _under(words[1], stdlib_root):
        return None
    lines = err.decode(errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else f"exit status {proc.returncode}"


def _first_working(build, python_candidates: list[Interpreter]) -> tuple[Isolation | None, str]:
    problems = []
    for python in python_candidates:
        try:
            isolation = build(python)
        except _Unusable as err:
            return None, str(err)
        problem = _probe(isolation)
        if problem is None:
            return isolation, ""
        problems.append(f"{python.path}: {problem}")
    return None, "; ".join(problems)


@functools.lru_cache(maxsize=2)
def detect_isolation(allow_unsandboxed: bool = False) -> Isolation:
    """bubblewrap when it works here; else, if allowed, a plain process (never as root); else a UserError."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        why = "bwrap is not installed"
    else:
        isolation, problems = _first_working(functools.partial(_bubblewrap, os.path.realpath(bwrap)), interpreters())
        if isolation is not None:
            return isolation
        why = f"bwrap does not work here ({problems})"
    if not allow_unsandboxed:
        raise UserError(f"the coding eval runs model-written code only inside bubblewrap, and {why}: install it "
                        f"(apt-get install bubblewrap) or pass {UNSANDBOXED_FLAG} to run that code with rlimits only")
    isolation, problems = _first_working(_unsandboxed, interpreters())
    if isolation is None:
        raise UserError(f"refusing to run model-written code as root: {why}, and dropping to uid {NOBODY} fails "
                        f"({problems}); install bubblewrap (apt-get install bubblewrap)")
    return isolation
