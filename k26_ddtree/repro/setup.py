"""`k26-deploy setup` / `env/setup_env.sh`: bring this machine to the pinned stack.

One plan, two front doors: `env/setup_env.sh` runs this module with the system
python (standard library only) before any venv exists, and `k26-deploy setup`
calls the same functions. Every step first checks whether it is already
satisfied, so running it twice does nothing the second time.

GPU box: CUDA 13.0 toolkit from NVIDIA's apt repository when missing or another
release (installed side by side, selected with update-alternatives, never by
symlinking headers between toolkits), the venv python's dev headers (Triton
JIT-compiles a C launcher against Python.h), aria2 (model download), then a
venv with torch (CUDA 13.0 build) + sglang + this package, at the pins of the
`--sglang` version (sglang_versions.py holds each version's pins and the default).
No GPU: sglang without its dependencies (its sources are what the patch
set edits; its CUDA stack cannot run here) + this package over a CPU torch, from
PyTorch's CPU index when it answers, else torch 2.13.0 from pip's own sources.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from k26_ddtree.cli.checks import path_arg
from k26_ddtree.errors import UserError
from k26_ddtree.repro import host
from k26_ddtree.repro.sglang_versions import DEFAULT, PINS, SglangPins, known, pins_for

CUDA_RELEASE = "13.0"
CUDA_APT_PACKAGE = "cuda-toolkit-13-0"
DEFAULT_CUDA_HOME = "/usr/local/cuda-13.0"
MIN_DRIVER_MAJOR = 580  # CUDA 13.0's minimum Linux driver branch
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# Without that index: the release the CI machines carry as a local CPU wheel (tests/run.sh reads it here too).
CPU_TORCH_FALLBACK = "2.13.0"
INDEX_TIMEOUT_S = 10
CUDA_KEYRING = "cuda-keyring_1.1-1_all.deb"
# Distributions NVIDIA publishes a CUDA apt repository for, as its URL spells them.
CUDA_REPO_DISTROS = {("ubuntu", "24.04"): "ubuntu2404", ("ubuntu", "22.04"): "ubuntu2204",
                     ("debian", "12"): "debian12"}
CUDA_REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}

# Runs inside the target interpreter: its version, whether Python.h and ensurepip are there,
# and which of our pinned distributions the environment already holds.
_PROBE = r"""
import json, os, sys, sysconfig
import importlib.metadata as md
dists, source = {}, None
for name in ("torch", "torchvision", "torchaudio", "sglang", "k26-ddtree"):
    try:
        dists[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
if "k26-ddtree" in dists:
    dist = md.distribution("k26-ddtree")
    raw = dist.read_text("direct_url.json")
    info = json.loads(raw) if raw else {}
    # Only an install inside this environment puts `k26-deploy` into its bin/.
    inside = os.path.realpath(str(dist.locate_file(""))).startswith(os.path.realpath(sys.prefix) + os.sep)
    if inside and info.get("dir_info", {}).get("editable"):
        source = info.get("url")
try:
    import ensurepip
    has_ensurepip = True
except ImportError:
    has_ensurepip = False
print(json.dumps({
    "version": list(sys.version_info[:2]),
    "headers": os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
    "ensurepip": has_ensurepip,
    "dists": dists,
    "k26_source": source,
}))
"""


@dataclass(frozen=True)
class Step:
    """One thing setup does: the commands, or why nothing needs doing."""

    title: str
    commands: tuple[tuple[str, ...], ...] = ()
    satisfied: str | None = None
    note: str | None = None  # why the commands are what they are, when that is not obvious


@dataclass(frozen=True)
class Facts:
    """What the plan is decided from; `probe()` reads it from the machine, tests build it by hand."""

    source_root: Path
    venv: Path
    python: str
    python_version: tuple[int, int]
    python_headers: bool
    python_ensurepip: bool
    venv_exists: bool
    venv_dists: dict[str, str] = field(default_factory=dict)
    venv_k26_source: str | None = None
    gpus: tuple[str, ...] = ()
    driver: str | None = None
    cuda_home: Path = Path(DEFAULT_CUDA_HOME)
    cuda_home_release: str | None = None
    default_cuda_release: str | None = None
    cuda_repo_configured: bool = False
    os_id: str = ""
    os_version: str = ""
    arch: str = "x86_64"
    aria2: bool = False
    has_apt: bool = False
    is_root: bool = False
    has_sudo: bool = False
    downloader: str | None = "curl"
    cpu_torch_index: str = CPU_TORCH_INDEX
    cpu_torch_index_answers: bool = True
    pins: SglangPins = PINS[DEFAULT]  # the --sglang version's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--venv", type=path_arg, default=None,
                        help="virtual environment to create or complete (default: .venv at the repository root)")
    parser.add_argument("--python", default=None,
                        help="interpreter the venv is created from (default: the one running setup)")
    parser.add_argument("--gpu", choices=("auto", "yes", "no"), default="auto",
                        help="install the GPU stack: auto = when `nvidia-smi -L` lists a GPU (default)")
    parser.add_argument("--cuda-home", type=path_arg, default=Path(DEFAULT_CUDA_HOME),
                        help=f"where the CUDA {CUDA_RELEASE} toolkit is or will be (default: {DEFAULT_CUDA_HOME})")
    parser.add_argument("--cpu-torch-index", default=CPU_TORCH_INDEX,
                        help="index for a CPU-only torch when none is installed (default: %(default)s)")
    parser.add_argument("--sglang", default=None, metavar="VERSION",
                        help=f"SGLang version to install with its own pins (known: {known()})")
    parser.add_argument("--dry-run", action="store_true",
                        help="list every step and whether it would run; change nothing")


def _probe_python(python: str) -> dict:
    out = host.run_tool([python, "-c", _PROBE], timeout=120)
    if not out.ok:
        last = (out.output.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"cannot run {python} to inspect it: {last}")
    try:
        return json.loads(out.output.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise UserError(f"unexpected answer from {python} when inspecting it: {out.output.strip()[:200]}")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def wants_gpu(choice: str, gpus: tuple[str, ...]) -> bool:
    """--gpu yes, or auto on a machine whose `nvidia-smi -L` lists a GPU."""
    return choice == "yes" or (choice == "auto" and bool(gpus))


def probe(args: argparse.Namespace, source_root: Path) -> Facts:
    pins = pins_for(args.sglang)
    venv = (args.venv or source_root / ".venv").absolute()
    if venv.exists() and not venv.is_dir():
        raise UserError(f"--venv {venv} exists and is not a directory")
    python = args.python or sys.executable
    venv_exists = _venv_python(venv).exists()
    info = _probe_python(str(_venv_python(venv)) if venv_exists else python)
    gpus = tuple(host.gpu_list()) if args.gpu != "no" else ()
    cuda_home = args.cuda_home.absolute()
    osr = host.os_release()
    downloader = next((tool for tool in ("curl", "wget") if shutil.which(tool)), None)
    venv_dists = info["dists"] if venv_exists else {}
    index_answers = True
    if not wants_gpu(args.gpu, gpus) and "torch" not in venv_dists:
        # Asked once, up front: pip would retry an unreachable index for minutes, loudly.
        print(f"setup: asking the CPU torch index {args.cpu_torch_index} ({INDEX_TIMEOUT_S} s at most)", flush=True)
        index_answers = host.url_answers(f"{args.cpu_torch_index.rstrip('/')}/torch/", INDEX_TIMEOUT_S)
    return Facts(
        source_root=source_root,
        venv=venv,
        python=python,
        python_version=tuple(info["version"]),
        python_headers=bool(info["headers"]),
        python_ensurepip=bool(info["ensurepip"]),
        venv_exists=venv_exists,
        venv_dists=venv_dists,
        venv_k26_source=info["k26_source"] if venv_exists else None,
        gpus=gpus,
        driver=host.driver_version() if gpus else None,
        cuda_home=cuda_home,
        cuda_home_release=host.nvcc_release(cuda_home / "bin" / "nvcc"),
        default_cuda_release=host.nvcc_release("/usr/local/cuda/bin/nvcc"),
        cuda_repo_configured=Path("/usr/share/keyrings/cuda-archive-keyring.gpg").exists(),
        os_id=osr.get("ID", ""),
        os_version=osr.get("VERSION_ID", ""),
        arch=host.machine_arch(),
        aria2=shutil.which("aria2c") is not None,
        has_apt=shutil.which("apt-get") is not None,
        is_root=os.geteuid() == 0,
        has_sudo=shutil.which("sudo") is not None,
        downloader=downloader,
        cpu_torch_index=args.cpu_torch_index,
        cpu_torch_index_answers=index_answers,
        pins=pins,
    )


def cuda_repo_url(os_id: str, os_version: str, arch: str) -> str:
    """NVIDIA's apt repository for this distribution, e.g. .../repos/ubuntu2404/x86_64/."""
    distro = CUDA_REPO_DISTROS.get((os_id, os_version))
    repo_arch = CUDA_REPO_ARCH.get(arch)
    if distro is None or repo_arch is None:
        known = ", ".join(f"{i} {v}" for i, v in CUDA_REPO_DISTROS)
        raise UserError(
            f"no CUDA {CUDA_RELEASE} apt repository known for {os_id or 'this OS'} {os_version} ({arch}); "
            f"supported: {known}. Install the CUDA {CUDA_RELEASE} toolkit from NVIDIA yourself "
            f"(it must provide {DEFAULT_CUDA_HOME}/bin/nvcc), then rerun setup")
    return f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{repo_arch}/"


def _driver_major(driver: str) -> int | None:
    head = driver.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _as_root(facts: Facts, argv: list[str]) -> tuple[str, ...]:
    if facts.is_root:
        return tuple(argv)
    if not facts.has_sudo:
        raise UserError(f"`{shlex.join(argv)}` needs root and sudo is not installed; rerun setup as root")
    return ("sudo", *argv)


def _apt(facts: Facts, packages: list[str]) -> tuple[tuple[str, ...], ...]:
    if not facts.has_apt:
        raise UserError(
            f"apt-get not found; install these with your package manager, then rerun setup: {' '.join(packages)}")
    noninteractive = ["env", "DEBIAN_FRONTEND=noninteractive"]
    return (
        _as_root(facts, [*noninteractive, "apt-get", "update"]),
        _as_root(facts, [*noninteractive, "apt-get", "install", "-y", "--no-install-recommends", *packages]),
    )


def _download(facts: Facts, url: str, dest: str) -> tuple[str, ...]:
    if facts.downloader == "curl":
        return ("curl", "-fsSL", "-o", dest, url)
    if facts.downloader == "wget":
        return ("wget", "-q", "-O", dest, url)
    raise UserError("neither curl nor wget is installed; install one (apt-get install curl), then rerun setup")


def _pip(facts: Facts, *args: str) -> tuple[str, ...]:
    return (str(_venv_python(facts.venv)), "-m", "pip", "install", *args)


def _gpu_system_steps(facts: Facts) -> list[Step]:
    if facts.driver is not None:
        major = _driver_major(facts.driver)
        if major is not None and major < MIN_DRIVER_MAJOR:
            raise UserError(
                f"NVIDIA driver {facts.driver} is older than CUDA {CUDA_RELEASE} needs (>= {MIN_DRIVER_MAJOR}); "
                f"install a {MIN_DRIVER_MAJOR}+ driver (e.g. apt-get install nvidia-driver-{MIN_DRIVER_MAJOR}-open), "
                "reboot, then rerun setup")
    toolkit_ok = facts.cuda_home_release == CUDA_RELEASE
    steps: list[Step] = []
    if toolkit_ok or facts.cuda_repo_configured:
        reason = (f"CUDA {CUDA_RELEASE} already at {facts.cuda_home}" if toolkit_ok
                  else "cuda-archive-keyring already installed")
        steps.append(Step("Add NVIDIA's CUDA apt repository", satisfied=reason))
    else:
        deb = f"/tmp/{CUDA_KEYRING}"
        url = cuda_repo_url(facts.os_id, facts.os_version, facts.arch) + CUDA_KEYRING
        steps.append(Step("Add NVIDIA's CUDA apt repository",
                          (_download(facts, url, deb), _as_root(facts, ["dpkg", "-i", deb]))))

    py = "python{}.{}".format(*facts.python_version)
    wanted = [
        (not toolkit_ok, CUDA_APT_PACKAGE, f"CUDA {CUDA_RELEASE} at {facts.cuda_home}"),
        (not facts.python_headers, f"{py}-dev", f"{py} headers (Python.h)"),
        (not facts.venv_exists and not facts.python_ensurepip, f"{py}-venv", f"{py} venv support"),
        (not facts.aria2, "aria2", "aria2c"),
    ]
    missing = [pkg for needed, pkg, _ in wanted if needed]
    if missing:
        steps.append(Step(f"Install system packages: {' '.join(missing)}", _apt(facts, missing)))
    else:
        steps.append(Step("Install system packages", satisfied=", ".join(have for _, _, have in wanted)))

    other_default = facts.default_cuda_release not in (None, CUDA_RELEASE)
    title = f"Make CUDA {CUDA_RELEASE} the system default (/usr/local/cuda)"
    if other_default:
        steps.append(Step(title, (_as_root(facts, ["update-alternatives", "--set", "cuda", str(facts.cuda_home)]),)))
    else:
        reason = ("no other toolkit at /usr/local/cuda" if facts.default_cuda_release is None
                  else f"/usr/local/cuda is already CUDA {CUDA_RELEASE}")
        steps.append(Step(title, satisfied=reason))
    return steps


def _cpu_system_steps(facts: Facts) -> list[Step]:
    if facts.venv_exists or facts.python_ensurepip:
        return []
    py = "python{}.{}".format(*facts.python_version)
    return [Step(f"Install system packages: {py}-venv", _apt(facts, [f"{py}-venv"]))]


def _venv_step(facts: Facts) -> Step:
    title = f"Create the venv {facts.venv}"
    if facts.venv_exists:
        return Step(title, satisfied="it exists")
    return Step(title, ((facts.python, "-m", "venv", str(facts.venv)),))


def _gpu_python_steps(facts: Facts) -> list[Step]:
    have, wanted = facts.venv_dists, facts.pins
    pins = {"torch": wanted.torch, "torchvision": wanted.torchvision, "torchaudio": wanted.torchaudio,
            "sglang": wanted.sglang}
    # A local-version suffix other than a CUDA one (e.g. "+cpu") is the wrong build for this box.
    wrong = [name for name, version in pins.items()
             if have.get(name, "").split("+")[0] != version or "+cpu" in have.get(name, "")]
    title = (f"Install torch {wanted.torch} (CUDA {CUDA_RELEASE} build) + sglang {wanted.sglang} "
             "with its dependencies")
    if not wrong:
        return [Step(title, satisfied=f"torch {have['torch']}, sglang {have['sglang']} installed")]
    return [Step(title, (_pip(facts, *(f"{name}=={version}" for name, version in pins.items())),))]


def _cpu_python_steps(facts: Facts) -> list[Step]:
    have = facts.venv_dists
    steps = []
    title = "Install a CPU-only torch"
    if "torch" in have:
        steps.append(Step(title, satisfied=f"torch {have['torch']} installed"))
    elif facts.cpu_torch_index_answers:
        steps.append(Step(title, (_pip(facts, "torch", "--index-url", facts.cpu_torch_index,
                                       "--no-warn-conflicts"),)))
    else:
        steps.append(Step(title, (_pip(facts, f"torch=={CPU_TORCH_FALLBACK}", "--no-warn-conflicts"),),
                          note=f"{facts.cpu_torch_index} does not answer (offline, or blocked here): torch "
                               f"{CPU_TORCH_FALLBACK} from pip's own sources instead (a local CPU wheel where "
                               "pip's find-links has one, as on CI; else PyPI's larger CUDA build)"))
    sglang = facts.pins.sglang
    title = f"Install sglang {sglang} sources without dependencies (no CUDA stack on this machine)"
    if have.get("sglang") == sglang:
        steps.append(Step(title, satisfied=f"sglang {sglang} installed"))
    else:
        steps.append(Step(title, (_pip(facts, "--no-deps", f"sglang=={sglang}"),)))
    return steps


def _toolkit_step(facts: Facts, gpu: bool) -> Step:
    title = f"Install this toolkit (editable, from {facts.source_root})"
    if facts.venv_k26_source == facts.source_root.as_uri():
        return Step(title, satisfied="k26-ddtree already installed from this checkout")
    quiet = () if gpu else ("--no-warn-conflicts",)
    return Step(title, (_pip(facts, "-e", str(facts.source_root), *quiet),))


def _check_step(facts: Facts, gpu: bool) -> Step:
    python = str(_venv_python(facts.venv))
    commands = [(str(facts.venv / "bin" / "k26-deploy"), "--version")]
    if gpu:
        commands.append((python, "-c", 'import torch, sglang; print("torch", torch.__version__, "cuda",'
                                       ' torch.version.cuda, "gpus", torch.cuda.device_count(),'
                                       ' "sglang", sglang.__version__)'))
    return Step("Check the installed toolkit", tuple(commands))


def plan(facts: Facts, gpu: bool) -> list[Step]:
    """The ordered steps for this machine; already-satisfied steps carry the reason."""
    if facts.python_version not in facts.pins.pythons:
        supported = ", ".join("{}.{}".format(*v) for v in facts.pins.pythons)
        raise UserError("python {}.{} is not supported by sglang {} (use one of {}; pass --python)".format(
            *facts.python_version, facts.pins.sglang, supported))
    steps = _gpu_system_steps(facts) if gpu else _cpu_system_steps(facts)
    steps.append(_venv_step(facts))
    steps += _gpu_python_steps(facts) if gpu else _cpu_python_steps(facts)
    steps.append(_toolkit_step(facts, gpu))
    steps.append(_check_step(facts, gpu))
    return steps


def describe(facts: Facts, gpu: bool) -> str:
    if gpu:
        first = facts.gpus[0].split(" (UUID")[0].split(": ", 1)[-1] if facts.gpus else ""
        gpus = f"{len(facts.gpus)}x {first}" if facts.gpus else "GPU forced with --gpu yes"
        driver = f", driver {facts.driver}" if facts.driver else ""
        return f"GPU machine ({gpus}{driver}): CUDA {CUDA_RELEASE} + {facts.pins.stack()}"
    return f"no GPU (nvidia-smi lists none): sglang {facts.pins.sglang} sources without its CUDA stack, CPU torch"


def cpu_conflicts_note(pins: SglangPins) -> str:
    return (f"setup: without GPUs sglang {pins.sglang}'s dependencies (its CUDA stack) stay out on purpose, "
            "so pip's report of them as missing is expected and switched off (--no-warn-conflicts); "
            "its sources are here to be patched and checked, not imported (importing sglang needs "
            "that stack: sgl_kernel, torchvision, its pinned transformers)")


def execute(steps: list[Step], dry_run: bool, say=print) -> None:
    """Print every step; run the unsatisfied ones unless dry_run. Raises UserError(code=1) on a failed command."""
    total = len(steps)
    for number, step in enumerate(steps, 1):
        label = f"[{number}/{total}] {step.title}"
        if step.satisfied:
            say(f"{label}: already done ({step.satisfied})")
            continue
        say(f"{label}: would run" if dry_run else label)
        if step.note:
            say(f"      note: {step.note}")
        for command in step.commands:
            say(f"      $ {shlex.join(command)}")
            if dry_run:
                continue
            sys.stdout.flush()
            started = time.monotonic()
            try:
                code = subprocess.call(list(command))
            except OSError as err:
                raise UserError(f"step {number}/{total} ({step.title}) could not start {command[0]}: {err}", code=1)
            if code != 0:
                raise UserError(
                    f"step {number}/{total} ({step.title}) failed: `{shlex.join(command)}` exited with {code}",
                    code=1)
            say(f"      ok ({time.monotonic() - started:.0f} s)")


def run_setup(args: argparse.Namespace, source_root: Path | None) -> int:
    if source_root is None:
        raise UserError("setup installs from a source checkout; run `bash env/setup_env.sh` in a clone of k26-ddtree")
    facts = probe(args, source_root)
    gpu = wants_gpu(args.gpu, facts.gpus)
    steps = plan(facts, gpu)
    print(f"setup: {describe(facts, gpu)}")
    if not gpu:
        print(cpu_conflicts_note(facts.pins))
    print(f"setup: {'dry run, nothing will change' if args.dry_run else 'plan'}: {len(steps)} steps")
    execute(steps, args.dry_run)
    if args.dry_run:
        pending = sum(1 for step in steps if not step.satisfied)
        print(f"setup: dry run done; {pending} step(s) would run")
    else:
        print(f"setup: done; activate with `source {facts.venv}/bin/activate` or call {facts.venv}/bin/k26-deploy")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="setup_env.sh",
        description="Install the pinned k26-ddtree stack on this machine (same as `k26-deploy setup`).")
    add_arguments(parser)
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    try:
        return run_setup(args, root if (root / "pyproject.toml").is_file() else None)
    except UserError as err:
        print(f"setup: error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print("setup: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
