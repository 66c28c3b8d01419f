"""The program that grades one answer inside the sandbox (`python -I -S -c <this file>`).

Standard library only, so any Python 3 can be the interpreter. argv: NONCE_FD RESULT_FD
CPU_S MEMORY_MB NPROC FSIZE_MB; stdin: {"solution": ..., "tests": ...} as JSON.

Before the model's code exists it reads the nonce and closes its pipe, reads and closes
stdin, compiles both sources, and lowers its own rlimits for good. Then it runs the
solution and the hidden tests in one namespace, and only after the last test passed it
writes the nonce to RESULT_FD, a pipe the harness reads. Stdout and stderr carry
diagnostics only, so printing a pass mark or leaving early with status 0 passes nothing.

The audit hook is no boundary (the sandbox around this process is one). It turns the usual
mistakes into clear failure reasons, and keeps the nonce out of easy reach: no gc walks,
other threads' frames, trace hooks, ctypes or /proc.
"""

import json
import os
import resource
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED = {
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "pty.spawn", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.symlink", "os.link", "os.chroot", "os.kill",
    "os.killpg", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
    "sys.settrace", "sys.setprofile",
}
PATH_EVENTS = {
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree",
    "os.rename", "shutil.copyfile", "shutil.move",
}


def set_limits(cpu_s, memory_mb, nproc, fsize_mb):
    for name, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_mb << 20),
                        (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_FSIZE, fsize_mb << 20),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(name, (value, value))


def audit_hook(root):
    def full_path(path):
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        return os.path.normpath(os.path.join(root, os.fspath(path)))

    def inside(path):
        if isinstance(path, int):
            return True
        full = full_path(path)
        return full == root or full.startswith(root + os.sep)

    def deny(what):
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event, args):
        if event in BLOCKED:
            deny(event)
        if event == "open":
            path, mode, flags = args
            if not isinstance(path, int) and (full_path(path) + os.sep).startswith("/proc" + os.sep):
                deny(f"opening {path}")
            writing = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and flags is not None and flags & WRITE_FLAGS)
            if writing and not inside(path):
                deny(f"writing {path}")
        elif event in PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg):
                    deny(f"{event} on {arg}")

    return hook


def main():
    nonce_fd, result_fd, cpu_s, memory_mb, nproc, fsize_mb = (int(arg) for arg in sys.argv[1:7])
    nonce = os.read(nonce_fd, 64)
    os.close(nonce_fd)
    task = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    solution = compile(task["solution"], "solution.py", "exec")
    tests = compile(task["tests"], "tests.py", "exec")
    del task
    set_limits(cpu_s, memory_mb, nproc, fsize_mb)
    sys.addaudithook(audit_hook(os.path.abspath(os.getcwd())))
    namespace = {"__name__": "solution"}
    exec(solution, namespace)
    exec(tests, namespace)
    os.write(result_fd, nonce + b"\n")


if __name__ == "__main__":
    main()
