"""Offline site bundle: everything one SGLang version's triton-backend DFlash/DDTree path needs,
for a machine with no network, as one checked .tar.xz. The packages per version are in
sglang_versions.py (`--sglang VERSION`).

Layout of the archive (one top folder, so it unpacks anywhere):
    k26-bundle/install.sh     checks SHA256SUMS, then moves site/ to the target (python3, tar, sha256sum only)
    k26-bundle/SHA256SUMS     sha256sum -c format, every file under site/
    k26-bundle/bundle.json    sglang, python, sm, the packages and wheels it came from, what was left to the target
    k26-bundle/site/...       a PYTHONPATH folder: unpacked wheels, trimmed for the sm, plus k26_ddtree

Wheels are fetched with `pip download --no-deps --only-binary=:all:` for the target's
Python and manylinux platforms and cached, so a second build is offline.
"""

from __future__ import annotations

import base64
import fnmatch
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from k26_ddtree import __version__
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import parse_sums, sha256_file
from k26_ddtree.repro.sglang_versions import SglangPins

DEFAULT_CACHE = Path("/var/cache/k26/gpu/wheels")
TOP = "k26-bundle"
MAX_MIB = 64

# The sglang wheel is tagged per CPython only for optional native extensions (gRPC; in 0.5.17
# also the opt-in Rust server and one model's image processor); its Python source serves any
# CPython, so the cp311 wheel is fetched for every target and shipped without .so files.
SOURCE_ONLY = {"sglang": ("3.11", "manylinux_2_34_x86_64")}

MANYLINUX = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_26_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(spec: str) -> tuple[str, str]:
    """'Name==1.2' -> ('name', '1.2'); a bare name -> ('name', '')."""
    spec = spec.strip()
    if "==" in spec:
        name, version = spec.split("==", 1)
        return canonical(name), version.strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec):
        raise UserError(f"cannot read package pin {spec!r} (expected NAME==VERSION)")
    return canonical(spec), ""


def read_have_file(path: Path) -> list[str]:
    """Pins from `pip freeze` output; editable and URL lines carry no usable version and are skipped."""
    if not path.is_file():
        raise UserError(f"--have-file {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--have-file {path}: not a `pip freeze` text file (not UTF-8)") from None
    pins = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or " @ " in line:
            continue
        pins.append(line)
    return pins


@dataclass
class Selection:
    """Which requirements travel and which the target already has."""
    bring: list[tuple[str, str]] = field(default_factory=list)
    already_there: list[tuple[str, str]] = field(default_factory=list)


def select(requirements, have: list[str]) -> Selection:
    """Leave out a requirement only when the target has that exact version (any other version is shadowed)."""
    have_versions = dict(parse_pin(p) for p in have)
    sel = Selection()
    for spec in requirements:
        name, version = parse_pin(spec)
        if have_versions.get(name) == version:
            sel.already_there.append((name, version))
        else:
            sel.bring.append((name, version))
    return sel


# --- trimming -----------------------------------------------------------------------------------

def keep_member(package: str, path: str, sm: str) -> bool:
    """Whether a file of an unpacked wheel travels (paths relative to the site folder)."""
    if package == "sglang":
        return not (path.startswith(("sglang/multimodal_gen/", "sglang/test/")) or path.endswith(".so"))
    if package == "sglang-kernel":
        if not path.startswith(("sgl_kernel/", "deep_gemm/", "triton_kernels/", "sglang_kernel-")):
            return False  # mscclpp libraries and headers, dlpack cmake files
        if fnmatch.fnmatch(path, "sgl_kernel/flash_ops*.so") or fnmatch.fnmatch(path, "sgl_kernel/flashmla_ops*.so"):
            return False  # FA3 and FlashMLA: unused with the triton attention backend
        if fnmatch.fnmatch(path, "sgl_kernel/infllm_ops*.so"):
            return False  # InfLLM-V2 attention, loaded only when that backend is chosen
        m = re.match(r"sgl_kernel/sm(\d+)/", path)
        return m is None or m.group(1) == sm
    if package == "flashinfer-python":
        return not path.startswith("flashinfer/data/cutlass/")
    if package == "xgrammar":
        return not path.startswith("xgrammar/lib/")  # the static library, for linking C++ against it
    return True


TRIMMED = {"sglang", "sglang-kernel", "flashinfer-python", "xgrammar"}

# Packages whose shared libraries come with DWARF debug info: xgrammar 0.2.1's bindings are 53 MB
# of which 50 are debug sections (8 MiB of the archive); `strip --strip-debug` keeps every symbol.
DEBUG_STRIPPED = {"xgrammar"}


def strip_tool(packages) -> str | None:
    """The `strip` to run when any of `packages` needs one; UserError when it is not installed."""
    needing = sorted(set(packages) & DEBUG_STRIPPED)
    if not needing:
        return None
    tool = shutil.which("strip")
    if tool is None:
        raise UserError(f"`strip` not found: it drops the debug info of {', '.join(needing)}'s shared libraries "
                        "(install binutils, e.g. apt-get install binutils)")
    return tool


def strip_debug(tool: str, path: Path) -> None:
    proc = subprocess.run([tool, "--strip-debug", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"strip --strip-debug {path.name} failed: {proc.stderr.strip()[:200]}", code=1)


def wheel_target_path(member: str) -> str | None:
    """Where a wheel member lands in a site folder (None: not installed, e.g. scripts)."""
    m = re.match(r"[^/]+\.data/(purelib|platlib)/(.*)", member)
    if m:
        return m.group(2)
    if re.match(r"[^/]+\.data/", member):
        return None
    return member


def record_line(site: Path, rel: str) -> str:
    """A wheel RECORD row for site/rel: path, urlsafe-base64 SHA-256 without padding, size."""
    digest = base64.urlsafe_b64encode(bytes.fromhex(sha256_file(site / rel))).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{(site / rel).stat().st_size}"


def unpack_wheel(wheel: Path, package: str, site: Path, sm: str, strip: str | None) -> int:
    """Unpack the kept members into site/ (shared libraries of DEBUG_STRIPPED packages through
    `strip`); returns the bytes written. A TRIMMED package's RECORD is written anew over the files
    it kept: xgrammar finds its bindings library through it (tvm_ffi's load_lib_module)."""
    written = 0
    kept, record = [], None
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            rel = wheel_target_path(info.filename)
            if rel is None or not keep_member(package, rel, sm):
                continue
            if package in TRIMMED and rel.endswith(".dist-info/RECORD"):
                record = rel
                continue
            kept.append(rel)
            dest = site / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o111:
                dest.chmod(0o755)
            if package in DEBUG_STRIPPED and rel.endswith(".so"):
                strip_debug(strip, dest)
            written += dest.stat().st_size
    if record is not None:
        rows = [record_line(site, rel) for rel in sorted(kept)] + [f"{record},,"]
        (site / record).write_text("\n".join(rows) + "\n")
        written += (site / record).stat().st_size
    return written


# --- download -----------------------------------------------------------------------------------

def loads_under(wheel_name: str, python: str) -> bool:
    """Whether a wheel's Python and ABI tags serve CPython `python` ("3.12"): pure Python, that
    CPython's own build, or a stable-ABI (abi3) build for it or an older one."""
    parts = wheel_name[:-len(".whl")].split("-")
    if len(parts) < 5:
        return False
    minor = int(python.split(".")[1])
    abis = parts[-2].split(".")
    for tag in parts[-3].split("."):
        if tag.startswith("py"):
            return True
        built = re.fullmatch(r"cp3(\d+)", tag)
        if built and (int(built.group(1)) == minor or ("abi3" in abis and int(built.group(1)) <= minor)):
            return True
    return False


def fetch_python(name: str, python: str) -> str:
    """The Python a package's wheel is fetched for: the target's, or its SOURCE_ONLY tag."""
    return SOURCE_ONLY[name][0] if name in SOURCE_ONLY else python


def cached_wheel(cache: Path, name: str, version: str, python: str) -> Path | None:
    """The cached wheel of name==version that loads under `python` (one cache serves every target)."""
    stem = re.sub(r"[-.]+", "_", name)
    for wheel in sorted(cache.glob("*.whl")):
        parts = wheel.name.split("-")
        if (len(parts) >= 2 and canonical(parts[0]) == canonical(stem) and parts[1] == version
                and loads_under(wheel.name, fetch_python(name, python))):
            return wheel
    return None


def pip_download(cache: Path, pins: list[tuple[str, str]], python: str, platforms) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--python-version", python, "--implementation", "cp", "-d", str(cache)]
    for plat in platforms:
        cmd += ["--platform", plat]
    cmd += [f"{n}=={v}" for n, v in pins]
    print(f"bundle: downloading {len(pins)} wheel(s) into {cache}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "; ".join(proc.stderr.strip().splitlines()[-3:])
        raise UserError(f"pip download failed for {', '.join(n for n, _ in pins)}: {tail}", code=1)


def not_cached(bring, cache: Path, python: str) -> list[tuple[str, str]]:
    return [(n, v) for n, v in bring if cached_wheel(cache, n, v, python) is None]


def fetch_wheels(bring, missing, cache: Path, python: str) -> dict[str, Path]:
    """Download `missing` (a part of `bring`) into the cache; returns every wheel of `bring`."""
    cache.mkdir(parents=True, exist_ok=True)
    regular = [(n, v) for n, v in missing if n not in SOURCE_ONLY]
    if regular:
        pip_download(cache, regular, python, MANYLINUX + ("any",))
    for name, version in missing:
        if name in SOURCE_ONLY:
            tag_python, platform = SOURCE_ONLY[name]
            pip_download(cache, [(name, version)], tag_python, (platform,))
    wheels = {}
    for name, version in bring:
        wheel = cached_wheel(cache, name, version, python)
        if wheel is None:
            raise UserError(f"no wheel for {name}=={version} in {cache} after download", code=1)
        wheels[name] = wheel
    return wheels


# --- this package -------------------------------------------------------------------------------

def copy_self(site: Path) -> None:
    """k26_ddtree's source plus its shipped data under k26_ddtree/_data (as the wheel lays them out)."""
    from k26_ddtree import resources

    package = Path(resources.__file__).resolve().parent
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(package, site / "k26_ddtree", ignore=ignore, dirs_exist_ok=True)
    for parts in resources.SHIPPED_DATA:
        src, dst = resources.data_path(*parts), site / "k26_ddtree" / "_data" / Path(*parts)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


# --- manifest and archive -----------------------------------------------------------------------

def manifest_lines(root: Path) -> list[str]:
    """'HASH  site/REL' for every file under root/site, sorted (sha256sum -c format)."""
    lines = []
    for path in sorted(p for p in (root / "site").rglob("*") if p.is_file() or p.is_symlink()):
        if path.is_symlink():
            raise UserError(f"bundle site holds a symlink, which the manifest cannot check: {path}", code=1)
        lines.append(f"{sha256_file(path)}  {path.relative_to(root).as_posix()}")
    return lines


INSTALL_SH = """#!/bin/sh
# Install this bundle's site folder: sh install.sh TARGET   (needs python3 {python}, sha256sum)
# Checks every file against SHA256SUMS and refuses unlisted files BEFORE anything lands at TARGET;
# then moves site/ into place in one rename. Prints the PYTHONPATH line to use.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
target=${{1:?usage: sh install.sh TARGET}}
cd "$here"
if [ -e "$target" ]; then echo "install.sh: $target already exists; choose a new folder" >&2; exit 2; fi
have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != "{python}" ]; then echo "install.sh: bundle is for Python {python}, python3 is $have" >&2; exit 2; fi
if ! sha256sum --quiet -c SHA256SUMS; then echo "install.sh: checksum mismatch; nothing installed" >&2; exit 1; fi
listed=$(wc -l < SHA256SUMS)
present=$(find site -type f | wc -l)
if [ "$listed" -ne "$present" ]; then echo "install.sh: site/ holds $present files, SHA256SUMS lists $listed; nothing installed" >&2; exit 1; fi
mkdir -p "$(dirname "$target")"
mv site "$target.partial" && mv "$target.partial" "$target"
echo "export PYTHONPATH=$target\\${{PYTHONPATH:+:\\$PYTHONPATH}}"
"""


def add_text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def write_archive(root: Path, out: Path, meta: dict, manifest: list[str], python: str) -> None:
    """tar.xz with files in sorted order and fixed mtimes: same inputs, same archive bytes."""
    tmp = out.with_name(out.name + ".partial")
    try:
        with tarfile.open(tmp, "w:xz", preset=6, format=tarfile.PAX_FORMAT) as tar:
            add_text(tar, f"{TOP}/install.sh", INSTALL_SH.format(python=python), 0o755)
            add_text(tar, f"{TOP}/SHA256SUMS", "\n".join(manifest) + "\n")
            add_text(tar, f"{TOP}/bundle.json", json.dumps(meta, indent=1, sort_keys=True) + "\n")
            for line in manifest:
                rel = line.split("  ", 1)[1]
                path = root / rel
                info = tar.gettarinfo(str(path), arcname=f"{TOP}/{rel}")
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)  # an interrupted or failed write leaves no half archive
    (out.with_name(out.name + ".sha256")).write_text(f"{sha256_file(out)}  {out.name}\n")


def build(pins: SglangPins, python: str, sm: str, have: list[str], out_dir: Path, cache: Path,
          max_mib: float) -> Path:
    if sm not in pins.kernel_sms:
        raise UserError(f"--sm {sm}: sglang-kernel {pins.bundled('sglang-kernel')} (sglang {pins.sglang}) ships "
                        f"kernels for sm {', '.join(pins.kernel_sms)} only")
    if not re.fullmatch(r"3\.\d+", python):
        raise UserError(f"--python {python}: give MAJOR.MINOR, e.g. 3.12")
    supported = ["{}.{}".format(*v) for v in pins.pythons]
    if python not in supported:
        raise UserError(f"--python {python}: sglang {pins.sglang} has wheels for Python {', '.join(supported)}")
    sel = select(pins.bundle, have)
    for name, version in sel.already_there:
        print(f"bundle: {name}=={version} is on the target already; not bundled")
    out = out_dir.absolute() / f"k26-site-py{python}-sm{sm}.tar.xz"
    strip = strip_tool(name for name, _ in sel.bring)
    missing = not_cached(sel.bring, cache, python)
    # Said before anything starts: a bare `k26-deploy bundle` downloads for minutes into the cwd.
    print(f"bundle: will write {out} (--out picks the folder) for sglang {pins.sglang} "
          f"from {len(sel.bring)} packages; {len(missing)} of their wheels are not in {cache} and are downloaded first "
          "(pip; about 2 minutes when none is cached)", flush=True)
    wheels = fetch_wheels(sel.bring, missing, cache, python)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="k26-bundle-", dir=out_dir) as tmp:
        root = Path(tmp)
        site = root / "site"
        site.mkdir()
        packages = []
        for name, version in sel.bring:
            size = unpack_wheel(wheels[name], name, site, sm, strip)
            print(f"bundle: {name}=={version}: {size / 2**20:.1f} MiB unpacked", flush=True)
            packages.append({"name": name, "version": version, "wheel": wheels[name].name,
                             "wheel_sha256": sha256_file(wheels[name])})
        copy_self(site)
        manifest = manifest_lines(root)
        meta = {"k26_ddtree": __version__, "sglang": pins.sglang, "python": python, "sm": sm, "packages": packages,
                "left_to_target": [f"{n}=={v}" for n, v in sel.already_there], "files": len(manifest)}
        print(f"bundle: compressing {len(manifest)} files (xz, about a minute)", flush=True)
        write_archive(root, out, meta, manifest, python)
    size_mib = out.stat().st_size / 2**20
    print(f"bundle: {out} {size_mib:.1f} MiB")
    if size_mib > max_mib:
        raise UserError(f"bundle is {size_mib:.1f} MiB, over the {max_mib:g} MiB limit", code=1)
    return out


# --- install (python-only twin of install.sh) ---------------------------------------------------

def install(archive: Path, target: Path) -> Path:
    """Unpack next to target, check every hash and the file count, then rename into place."""
    if not archive.is_file():
        raise UserError(f"{archive}: no such bundle archive")
    side_sum = archive.with_name(archive.name + ".sha256")
    if side_sum.is_file():
        expected = side_sum.read_text().split()[0]
        if sha256_file(archive) != expected:
            raise UserError(f"{archive}: archive SHA256 differs from {side_sum.name}; nothing installed", code=1)
    if target.exists():
        raise UserError(f"{target} already exists; choose a new folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create {target}: {err.strerror} ({target.parent})") from None
    with tempfile.TemporaryDirectory(prefix=".k26-install-", dir=target.parent) as tmp:
        stage = Path(tmp)
        try:
            tar = tarfile.open(archive, "r:*")
        except tarfile.TarError:
            raise UserError(f"{archive} is not a bundle archive (not a tar file); nothing installed") from None
        with tar:
            for member in tar.getmembers():
                if not member.name.startswith(f"{TOP}/") or ".." in Path(member.name).parts:
                    raise UserError(f"{archive}: unexpected member {member.name!r}; nothing installed", code=1)
            tar.extractall(stage, filter="data")
        root = stage / TOP
        if not (root / "SHA256SUMS").is_file():
            raise UserError(f"{archive}: no {TOP}/SHA256SUMS inside; nothing installed", code=1)
        try:
            listed = parse_sums((root / "SHA256SUMS").read_text(errors="replace"), f"{archive}:{TOP}/SHA256SUMS")
        except UserError as err:
            raise UserError(f"{err}; nothing installed", code=1) from None
        present = {p.relative_to(root).as_posix() for p in (root / "site").rglob("*") if p.is_file()}
        if present != set(listed):
            extra = sorted(present - set(listed))[:3]
            absent = sorted(set(listed) - present)[:3]
            raise UserError(f"bundle file list differs from SHA256SUMS (extra {extra}, missing {absent}); "
                            "nothing installed", code=1)
        for rel, digest in listed.items():
            if sha256_file(root / rel) != digest:
                raise UserError(f"checksum mismatch for {rel}; nothing installed", code=1)
        os.replace(root / "site", target)
    return target
