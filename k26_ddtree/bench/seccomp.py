"""The seccomp filter bubblewrap loads before the eval's code starts (`bwrap --seccomp FD`).

A deny list, as a raw classic-BPF program: the syscalls no stdlib-only solution needs and
that widen the kernel surface or reach other processes (ptrace, process_vm_*, bpf,
io_uring, keyrings, mounts and namespaces, module loading, ...) fail with EPERM; socket()
fails too, so no socket exists even inside the empty network namespace. clone3 answers
ENOSYS (its flags live in memory a filter cannot read; libc then falls back to clone), and
clone with a namespace flag is refused. Syscalls of another ABI than the machine's own
(i386 or x32 on x86-64) end the process: their numbers differ, so a deny list by number
would not hold for them.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06

_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000

_OFFSET_NR = 0
_OFFSET_ARCH = 4
_OFFSET_ARG0_LOW = 16  # args[0], low 32 bits (both ABIs below are little-endian)

_X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NAMESPACE_FLAGS = 0x7E020000

# (audit arch, syscall numbers) per machine; asm-generic numbering for aarch64.
_ABIS = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "socket": 41,
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "mount_setattr": 442, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "bpf": 321, "userfaultfd": 323,
        "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "swapon": 167, "swapoff": 168, "reboot": 169, "syslog": 103, "acct": 163,
        "quotactl": 179, "vhangup": 153, "iopl": 172, "ioperm": 173,
        "clone": 56, "clone3": 435,
    }),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "socket": 198,
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "mount_setattr": 442, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "bpf": 280, "userfaultfd": 282,
        "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "swapon": 224, "swapoff": 225, "reboot": 142, "syslog": 116, "acct": 89,
        "quotactl": 60, "vhangup": 58,
        "clone": 220, "clone3": 435,
    }),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


@functools.cache  # every sandboxed start loads the same program
def deny_filter(machine: str | None = None) -> bytes | None:
    """The program for this machine (`platform.machine()`), or None for one it does not know."""
    abi = _ABIS.get(machine or platform.machine())
    if abi is None:
        return None
    arch, numbers = abi
    program = [
        _op(_LD_W_ABS, _OFFSET_ARCH),
        _op(_JEQ, arch, jt=1),
        _op(_RET, _KILL_PROCESS),
        _op(_LD_W_ABS, _OFFSET_NR),
    ]
    if arch == _ABIS["x86_64"][0]:
        program += [_op(_JGE, _X32_BIT, jf=1), _op(_RET, _KILL_PROCESS)]
    for name, number in numbers.items():
        if name in ("clone", "clone3"):
            continue
        program += [_op(_JEQ, number, jf=1), _op(_RET, _ERRNO | errno.EPERM)]
    program += [
        _op(_JEQ, numbers["clone3"], jf=1),
        _op(_RET, _ERRNO | errno.ENOSYS),
        _op(_JEQ, numbers["clone"], jf=3),
        _op(_LD_W_ABS, _OFFSET_ARG0_LOW),
        _op(_JSET, _CLONE_NAMESPACE_FLAGS, jf=1),
        _op(_RET, _ERRNO | errno.EPERM),
        _op(_RET, _ALLOW),
    ]
    return b"".join(program)
