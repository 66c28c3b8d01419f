"""`k26-deploy bundle`: selection against what the target has, trimming per sm, the SHA256 manifest,
and installing (python and install.sh) with refusal on any tampering. Built from small fake wheels
in a local cache, so nothing is downloaded."""

import base64
import dataclasses
import hashlib
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from k26_ddtree.cli.main import main as cli
from k26_ddtree.errors import UserError
from k26_ddtree.repro import bundle
from k26_ddtree.repro.sglang_versions import DEFAULT, PINS

PY = "%d.%d" % sys.version_info[:2]
# The default version's pins over a few small wheels, so nothing is downloaded.
FAKE_PINS = dataclasses.replace(PINS[DEFAULT], bundle=(
    "sglang==0.5.11", "sglang-kernel==0.4.2", "flashinfer-python==0.6.8.post1", "tiny-pkg==1.0", "already-there==2.0"))


def make_wheel(cache: Path, filename: str, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(cache / filename, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


@pytest.fixture
def fake_cache(tmp_path):
    cache = tmp_path / "wheels"
    cache.mkdir()
    make_wheel(cache, "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl", {
        "sglang/__init__.py": b"", "sglang/srt/server_args.py": b"x = 1\n",
        "sglang/multimodal_gen/big.py": b"", "sglang/test/t.py": b"", "sglang/grpc_ext.cpython-311.so": b"so",
        "sglang-0.5.11.dist-info/METADATA": b"Name: sglang\nVersion: 0.5.11\n",
        "sglang-0.5.11.dist-info/RECORD": b"stale"})
    make_wheel(cache, "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl", {
        "sgl_kernel/__init__.py": b"", "sgl_kernel/sm90/common_ops.abi3.so": b"90",
        "sgl_kernel/sm100/common_ops.abi3.so": b"100", "sgl_kernel/flash_ops.abi3.so": b"fa3",
        "sgl_kernel/flashmla_ops.abi3.so": b"mla", "sgl_kernel/spatial_ops.abi3.so": b"sp",
        "deep_gemm/include/deep_gemm/a.cuh": b"h", "triton_kernels/k.py": b"",
        "lib/mscclpp.so": b"m", "_mscclpp.cpython-310-x86_64-linux-gnu.so": b"m"})
    make_wheel(cache, "flashinfer_python-0.6.8.post1-py3-none-any.whl", {
        "flashinfer/__init__.py": b"", "flashinfer/data/cutlass/big.h": b"c", "flashinfer/data/include/k.h": b"i"})
    make_wheel(cache, "tiny_pkg-1.0-py3-none-any.whl", {
        "tiny_pkg-1.0.data/purelib/tiny.py": b"T = 1\n", "tiny_pkg-1.0.data/scripts/tool": b"#!/bin/sh\n"})
    make_wheel(cache, "already_there-2.0-py3-none-any.whl", {"already_there.py": b""})
    return cache


def build(fake_cache, out, sm="90", pins=FAKE_PINS):
    return bundle.build(pins, PY, sm, ["already_there==2.0", "torch==2.11.0"], out, fake_cache, 64)


def test_selection_leaves_out_only_exact_versions():
    sel = bundle.select(["transformers==5.6.0", "torch==2.11.0", "numpy==2.0"],
                        ["transformers==5.17.0", "Torch==2.11.0"])
    assert sel.bring == [("transformers", "5.6.0"), ("numpy", "2.0")]
    assert sel.already_there == [("torch", "2.11.0")]


def test_have_file_reads_pip_freeze(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0\n-e git+https://x#egg=y\nfoo @ file:///w/foo.whl\n# c\ntriton==3.6.0\n")
    assert bundle.read_have_file(freeze) == ["torch==2.11.0", "triton==3.6.0"]
    with pytest.raises(UserError):
        bundle.read_have_file(tmp_path / "missing.txt")


@pytest.mark.parametrize("package,path,sm,kept", [
    ("sglang-kernel", "sgl_kernel/sm90/common_ops.abi3.so", "90", True),
    ("sglang-kernel", "sgl_kernel/sm100/common_ops.abi3.so", "90", False),
    ("sglang-kernel", "sgl_kernel/sm100/common_ops.abi3.so", "100", True),
    ("sglang-kernel", "sgl_kernel/flash_ops.abi3.so", "90", False),
    ("sglang-kernel", "deep_gemm/include/cute/x.hpp", "90", True),
    ("sglang-kernel", "lib/mscclpp.so", "90", False),
    ("sglang", "sglang/multimodal_gen/a.py", "90", False),
    ("sglang", "sglang/srt/a.py", "90", True),
    ("flashinfer-python", "flashinfer/data/cutlass/a.h", "90", False),
    ("flashinfer-python", "flashinfer/data/include/a.h", "90", True),
])
def test_trim_rules(package, path, sm, kept):
    assert bundle.keep_member(package, path, sm) is kept


def test_build_trims_and_install_checks(fake_cache, tmp_path):
    archive = build(fake_cache, tmp_path / "out")
    assert archive.name == f"k26-site-py{PY}-sm90.tar.xz"
    site = bundle.install(archive, tmp_path / "site")
    present = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    assert "sgl_kernel/sm90/common_ops.abi3.so" in present and "deep_gemm/include/deep_gemm/a.cuh" in present
    assert not any(p.startswith(("sgl_kernel/sm100", "sglang/multimodal_gen", "sglang/test", "lib/",
                                 "flashinfer/data/cutlass")) for p in present)
    assert "sgl_kernel/flash_ops.abi3.so" not in present and "sglang/grpc_ext.cpython-311.so" not in present
    assert "sglang-0.5.11.dist-info/METADATA" in present
    assert "tiny.py" in present and "tool" not in present
    assert "already_there.py" not in present
    assert "k26_ddtree/repro/bundle.py" in present


def test_a_trimmed_package_records_the_files_it_kept(fake_cache, tmp_path):
    """RECORD is written anew over what stayed: paths and hashes of the files on disk, trimmed ones gone."""
    site = bundle.install(build(fake_cache, tmp_path / "out"), tmp_path / "site")
    rows = (site / "sglang-0.5.11.dist-info" / "RECORD").read_text().splitlines()
    listed = {row.split(",")[0]: row.split(",")[1:] for row in rows}
    kept = [*site.glob("sglang/**/*"), *site.glob("sglang-0.5.11.dist-info/*")]
    on_disk = {p.relative_to(site).as_posix() for p in kept if p.is_file()}
    assert set(listed) == on_disk
    assert listed["sglang-0.5.11.dist-info/RECORD"] == ["", ""]
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"x = 1\n").digest()).rstrip(b"=").decode()
    assert listed["sglang/srt/server_args.py"] == [f"sha256={digest}", "6"]


def _shared_library_with_debug_info(folder: Path) -> bytes:
    source = folder / "bindings.c"
    source.write_text("int xgrammar_answer(void) { return 42; }\n")
    library = folder / "libxgrammar_bindings.so"
    subprocess.run(["gcc", "-g", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library.read_bytes()


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("strip") is None, reason="needs gcc and strip")
def test_xgrammar_travels_without_its_static_library_or_debug_info_and_still_loads(fake_cache, tmp_path):
    import ctypes
    import importlib.metadata

    library = _shared_library_with_debug_info(tmp_path)
    assert b".debug_info" in library
    make_wheel(fake_cache, "xgrammar-0.2.1-cp312-cp312-manylinux_2_28_x86_64.whl", {
        "xgrammar/__init__.py": b"", "xgrammar/libxgrammar_bindings.so": library,
        "xgrammar/lib/libxgrammar.a": b"static", "xgrammar/include/xgrammar/matcher.h": b"h",
        "xgrammar-0.2.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: xgrammar\nVersion: 0.2.1\n",
        "xgrammar-0.2.1.dist-info/RECORD": b"xgrammar/lib/libxgrammar.a,,\n"})
    pins = dataclasses.replace(FAKE_PINS, bundle=(*FAKE_PINS.bundle, "xgrammar==0.2.1"), pythons=((3, 12),))
    archive = bundle.build(pins, "3.12", "90", [], tmp_path / "out", fake_cache, 64)
    site = bundle.install(archive, tmp_path / "site")
    shipped = site / "xgrammar" / "libxgrammar_bindings.so"
    assert b".debug_info" not in shipped.read_bytes() and shipped.stat().st_size < len(library)
    assert not (site / "xgrammar" / "lib").exists() and (site / "xgrammar" / "include" / "xgrammar").is_dir()
    assert ctypes.CDLL(str(shipped)).xgrammar_answer() == 42
    # tvm_ffi's load_lib_module finds xgrammar's bindings through the RECORD of its distribution.
    dist = next(importlib.metadata.distributions(name="xgrammar", path=[str(site)]))
    assert [str(f) for f in dist.files if f.name.endswith(".so")] == ["xgrammar/libxgrammar_bindings.so"]


def test_bundle_refuses_to_start_without_strip_when_xgrammar_travels(fake_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    pins = dataclasses.replace(FAKE_PINS, bundle=(*FAKE_PINS.bundle, "xgrammar==0.2.1"))
    with pytest.raises(UserError, match=r"`strip` not found: it drops the debug info of xgrammar's shared "):
        bundle.build(pins, PY, "90", [], tmp_path / "out", fake_cache, 64)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("wheel,python,loads", [
    ("tiny-1.0-py3-none-any.whl", "3.11", True),
    ("tiny-1.0-py2.py3-none-any.whl", "3.13", True),
    ("orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.12", True),
    ("orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.11", False),
    ("sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl", "3.12", True),
    ("apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_28_x86_64.whl", "3.11", False),
    ("jiter-0.19.0-1-cp311-cp311-manylinux_2_17_x86_64.whl", "3.11", True),
])
def test_wheel_tags_decide_which_python_a_cached_wheel_serves(wheel, python, loads):
    assert bundle.loads_under(wheel, python) is loads


def test_a_cached_wheel_for_another_python_is_fetched_anew(tmp_path):
    """One cache serves every target: a 3.12 build of a package is not shipped in a 3.11 bundle."""
    make_wheel(tmp_path, "orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.whl", {"orjson/__init__.py": b""})
    make_wheel(tmp_path, "sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl", {"sglang/__init__.py": b""})
    bring = [("orjson", "3.13.0"), ("sglang", "0.5.17")]
    assert bundle.not_cached(bring, tmp_path, "3.12") == []
    assert bundle.not_cached(bring, tmp_path, "3.11") == [("orjson", "3.13.0")]
    assert bundle.cached_wheel(tmp_path, "sglang", "0.5.17", "3.13").name.startswith("sglang-0.5.17-cp311")


def test_build_is_reproducible(fake_cache, tmp_path):
    a = build(fake_cache, tmp_path / "a").read_bytes()
    b = build(fake_cache, tmp_path / "b").read_bytes()
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()


def retar(archive: Path, edit) -> Path:
    """Unpack, let `edit` change the tree, pack again (SHA256SUMS untouched), drop the side .sha256."""
    work = archive.parent / "edit"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    edit(work / bundle.TOP)
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(work / bundle.TOP, arcname=bundle.TOP)
    archive.with_name(archive.name + ".sha256").unlink(missing_ok=True)
    return archive


def test_install_refuses_a_changed_archive(fake_cache, tmp_path):
    archive = build(fake_cache, tmp_path / "out")
    archive.write_bytes(archive.read_bytes() + b"\0")
    with pytest.raises(UserError, match="archive SHA256"):
        bundle.install(archive, tmp_path / "site")
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("edit", [
    lambda top: (top / "site" / "tiny.py").write_text("T = 2\n"),
    lambda top: (top / "site" / "extra.py").write_text(""),
])
def test_install_refuses_tampered_files(fake_cache, tmp_path, edit):
    archive = retar(build(fake_cache, tmp_path / "out"), edit)
    with pytest.raises(UserError, match="nothing installed"):
        bundle.install(archive, tmp_path / "site")
    assert not (tmp_path / "site").exists()
    assert not list(tmp_path.glob(".k26-install-*"))


def test_install_sh_needs_only_python3_tar_sha256sum(fake_cache, tmp_path):
    archive = build(fake_cache, tmp_path / "out")
    unpack = tmp_path / "unpack"
    unpack.mkdir()
    subprocess.run(["tar", "-xJf", str(archive), "-C", str(unpack)], check=True)
    script = unpack / bundle.TOP / "install.sh"
    done = subprocess.run(["sh", str(script), str(tmp_path / "site")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"export PYTHONPATH={tmp_path / 'site'}")
    assert (tmp_path / "site" / "tiny.py").read_text() == "T = 1\n"


def test_install_sh_refuses_a_tampered_file(fake_cache, tmp_path):
    archive = build(fake_cache, tmp_path / "out")
    unpack = tmp_path / "unpack"
    unpack.mkdir()
    subprocess.run(["tar", "-xJf", str(archive), "-C", str(unpack)], check=True)
    (unpack / bundle.TOP / "site" / "tiny.py").write_text("evil\n")
    done = subprocess.run(["sh", str(unpack / bundle.TOP / "install.sh"), str(tmp_path / "site")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "nothing installed" in done.stderr
    assert not (tmp_path / "site").exists()


def test_cli_errors_are_one_line(capsys, tmp_path):
    assert cli(["bundle", "--sm", "80", "--out", str(tmp_path)]) == 2
    assert "--sm 80: sglang-kernel 0.4.2 (sglang 0.5.11) ships kernels for sm 90, 100 only" in capsys.readouterr().err
    assert cli(["bundle", "--sglang", "0.5.17", "--sm", "80", "--out", str(tmp_path)]) == 2
    assert "--sm 80: sglang-kernel 0.4.5 (sglang 0.5.17) ships kernels for sm 90, 100 only" in capsys.readouterr().err
    assert cli(["bundle", "--sglang", "0.5.17", "--python", "3.9", "--out", str(tmp_path)]) == 2
    assert "--python 3.9: sglang 0.5.17 has wheels for Python 3.10, 3.11, 3.12, 3.13" in capsys.readouterr().err
    assert cli(["bundle", "--install", str(tmp_path / "x.tar.xz")]) == 2
    assert "--install needs --target" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        cli(["selftest"])
    assert stopped.value.code == 2, "the proving ground runs as python -m proving_ground, not from the product"
    assert "invalid choice: 'selftest'" in capsys.readouterr().err


def test_oversized_bundle_fails(fake_cache, tmp_path):
    with pytest.raises(UserError, match="over the"):
        bundle.build(FAKE_PINS, PY, "90", [], tmp_path / "out", fake_cache, 0.0001)


def test_mistaken_bundle_flags_and_archives_are_one_line(capsys, tmp_path):
    not_tar = tmp_path / "notes.txt"
    not_tar.write_text("not an archive\n")
    no_sums = tmp_path / "no-sums.tar.xz"
    with tarfile.open(no_sums, "w:xz") as tar:
        tar.add(not_tar, arcname=f"{bundle.TOP}/site/notes.txt")
    cases = [
        (["--install", str(not_tar), "--target", str(tmp_path / "site")], 2, "is not a bundle archive (not a tar file)"),
        (["--install", str(no_sums), "--target", str(tmp_path / "site")], 1, "SHA256SUMS inside; nothing installed"),
        (["--install", str(no_sums), "--target", str(not_tar / "site")], 2, f"cannot create {not_tar / 'site'}"),
        (["--target", str(tmp_path / "site")], 2, "--target only applies with --install"),
        (["--max-mib", "0", "--out", str(tmp_path)], 2, "--max-mib must be more than 0"),
        (["--have", "torch", "--out", str(tmp_path)], 2, "--have 'torch': give NAME==VERSION"),
        (["--have-file", str(no_sums), "--out", str(tmp_path)], 2, "not a `pip freeze` text file (not UTF-8)"),
        (["--sglang", "0.4", "--out", str(tmp_path)], 2, "--sglang 0.4: not a version k26-ddtree installs; known: "
                                                         "0.5.11 (default), 0.5.17"),
    ]
    for args, code, expected in cases:
        assert cli(["bundle", *args]) == code, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("k26-deploy: error: ") and expected in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-sums.tar.xz", "notes.txt"], "nothing left behind"
