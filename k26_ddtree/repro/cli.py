"""Subcommands of the repro family: setup, snapshot, manifest, verify, bundle."""

from __future__ import annotations

import argparse
from pathlib import Path

from k26_ddtree.cli.checks import path_arg
from k26_ddtree.errors import UserError
from k26_ddtree.resources import source_root


BUNDLE_HELP = """\
Build an offline site archive for a machine without network: one SGLang version's
Python source (--sglang), sglang-kernel trimmed to one sm, flashinfer without its CUTLASS
headers, transformers/tokenizers and the serving deps, plus k26_ddtree, with a SHA256 manifest.
Packages the target already has at the same version (--have, --have-file) stay out.

On the target (python3, tar, sha256sum only):
  tar -xJf k26-site-py3.12-sm90.tar.xz && sh k26-bundle/install.sh /opt/k26-site
or, where k26-deploy runs: k26-deploy bundle --install ARCHIVE --target DIR
"""


def _default_root() -> Path:
    return source_root() or Path.cwd()


def _setup(args: argparse.Namespace) -> int:
    from k26_ddtree.repro import setup

    return setup.run_setup(args, source_root())


def _snapshot(args: argparse.Namespace) -> int:
    from k26_ddtree.repro import snapshot

    root = (args.root or _default_root()).absolute()
    out = snapshot.take(args.out.absolute() if args.out else None, root)
    print(f"snapshot: written to {out}")
    return 0


def _root_and_manifest(args: argparse.Namespace, given: Path | None) -> tuple[Path, Path]:
    """The checked --root, and the manifest path (`given`, or ROOT/MANIFEST.sha256)."""
    from k26_ddtree.repro import manifest

    root = (args.root or _default_root()).absolute()
    manifest.check_root(root)
    return root, (given or root / manifest.MANIFEST_NAME).absolute()


def _manifest(args: argparse.Namespace) -> int:
    from k26_ddtree.repro import manifest

    root, out = _root_and_manifest(args, args.out)
    manifest.check_out(out)  # before --model-dir copies anything into the root
    for model_dir in args.model_dir:
        for rel in manifest.copy_model_metadata(root, model_dir):
            print(f"manifest: copied drafter metadata to {rel}")
    count = manifest.write(root, out)
    print(f"manifest: {count} files recorded in {out}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from k26_ddtree.repro import manifest

    root, path = _root_and_manifest(args, args.manifest)
    report = manifest.verify(root, path)
    for kind, names in (("missing", report.missing), ("changed", report.changed), ("extra", report.extra),
                        ("outside", report.outside)):
        for name in names:
            print(f"{kind}: {name}")
    if not report.clean:
        counts = f"{len(report.changed)} changed, {len(report.missing)} missing, {len(report.extra)} extra"
        notes = "extra = in a covered folder but not in the manifest"
        if report.outside:
            counts += f", {len(report.outside)} outside"
            notes += "; outside = a link that leaves the root"
        raise UserError(f"verify failed against {path}: {counts} ({notes})", code=1)
    print(f"verify: OK, {report.checked} files match {path}")
    return 0


def _bundle(args) -> int:
    from k26_ddtree.repro import bundle
    from k26_ddtree.repro.sglang_versions import pins_for

    if args.install:
        if not args.target:
            raise UserError("--install needs --target DIR")
        target = bundle.install(args.install, args.target)
        print(f"installed; use: export PYTHONPATH={target}")
        return 0
    if args.target:
        raise UserError("--target only applies with --install ARCHIVE")
    pins = pins_for(args.sglang)
    if not args.max_mib > 0:
        raise UserError(f"--max-mib must be more than 0, got {args.max_mib}")
    for pin in args.have:
        if "==" not in pin:
            raise UserError(f"--have {pin!r}: give NAME==VERSION, e.g. --have torch==2.11.0")
    have = list(args.have)
    if args.have_file:
        have += bundle.read_have_file(args.have_file)
    bundle.build(pins, args.python, args.sm, have, args.out, args.cache or bundle.DEFAULT_CACHE, args.max_mib)
    return 0


def register(sub) -> None:
    """Add this family's subcommands to the k26-deploy parser."""
    from k26_ddtree.repro import setup
    from k26_ddtree.repro.sglang_versions import DEFAULT, PINS, known

    default = PINS[DEFAULT]
    p = sub.add_parser(
        "setup", help=f"install the pinned stack on this machine (CUDA {setup.CUDA_RELEASE} + {default.stack()})",
        description=(
            "Install what k26-ddtree needs on this machine, checking each step first (idempotent). "
            f"GPU box: CUDA {setup.CUDA_RELEASE} toolkit from NVIDIA's apt repository when missing or another "
            "release, python dev headers, aria2, a venv with torch + sglang at the pins of --sglang VERSION "
            f"(default {default.stack()}) + this toolkit. No GPU: those sglang sources without their CUDA stack "
            "over a CPU torch. Same plan as env/setup_env.sh."))
    setup.add_arguments(p)
    p.set_defaults(func=_setup)

    p = sub.add_parser(
        "snapshot", help="record OS, driver, CUDA, GPUs, python, pip freeze, patch state, unit, profile",
        description=(
            "Write env/snapshots/snapshot-<host>-<UTC time>/ (or --out DIR): one file per item and "
            "index.json with how each was obtained and its status. A missing tool is recorded as "
            "'not available'; GPU items read 'none' on a machine without GPUs."))
    p.add_argument("--out", type=path_arg, default=None, help="folder to create (must not exist)")
    p.add_argument("--root", type=path_arg, default=None,
                   help="repository root whose env/snapshots/ receives it (default: this checkout or cwd)")
    p.set_defaults(func=_snapshot)

    p = sub.add_parser(
        "manifest", help="write MANIFEST.sha256 over the reproduction package",
        description=(
            "Hash patches/, services/, deploy/profiles/, bench/, env/ and REPRODUCE.md under --root into "
            "MANIFEST.sha256 (sha256sum format, sorted relative paths, written atomically). "
            "`sha256sum -c MANIFEST.sha256 --strict` at the root checks it as well as `k26-deploy verify`."))
    p.add_argument("--root", type=path_arg, default=None, help="repository root (default: this checkout or cwd)")
    p.add_argument("--out", type=path_arg, default=None, help="manifest path (default: ROOT/MANIFEST.sha256)")
    p.add_argument("--model-dir", type=path_arg, action="append", default=[],
                   help="drafter/target model folder whose SHA256SUMS and .k26-model.json are copied to "
                        "env/models/<name>/ and recorded (repeatable)")
    p.set_defaults(func=_manifest)

    p = sub.add_parser(
        "verify", help="check MANIFEST.sha256: missing, changed and extra files (exit 1 on any)",
        description=(
            "Compare the files under --root with MANIFEST.sha256. Prints 'missing:', 'changed:', "
            "'extra:' and 'outside:' lines (extra = a file in a covered folder that the manifest does not "
            "list; outside = a listed file that is a link leaving the root, never checked). "
            "Exit 0 when everything matches, 1 on any mismatch, 2 when the manifest is absent or malformed."))
    p.add_argument("--root", type=path_arg, default=None, help="repository root (default: this checkout or cwd)")
    p.add_argument("--manifest", type=path_arg, default=None, help="manifest path (default: ROOT/MANIFEST.sha256)")
    p.set_defaults(func=_verify)

    p = sub.add_parser("bundle", help="build or install the offline site archive (sglang + kernels + deps)",
                       description=BUNDLE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sglang", default=None, metavar="VERSION",
                   help=f"SGLang version whose package set the archive holds (known: {known()})")
    p.add_argument("--python", default="3.12", help="target MAJOR.MINOR (default 3.12)")
    p.add_argument("--sm", default="90", help="target compute capability without the dot: 90 (H100/H200) or 100 "
                   "(every other GPU, e.g. B300 sm_103 and RTX PRO 6000 sm_120: sglang-kernel loads its sm100 build)")
    p.add_argument("--have", action="append", default=[], metavar="NAME==VER",
                   help="a package the target already has (repeatable); exact version matches stay out")
    p.add_argument("--have-file", type=Path, help="`pip freeze` of the target, same meaning as --have")
    p.add_argument("--out", type=Path, default=Path("."), help="folder for the archive (default: here)")
    p.add_argument("--cache", type=Path, default=None, help="wheel cache (default /var/cache/k26/gpu/wheels)")
    p.add_argument("--max-mib", type=float, default=64.0, help="fail when the archive is larger (default 64)")
    p.add_argument("--install", type=Path, metavar="ARCHIVE", help="install ARCHIVE instead of building")
    p.add_argument("--target", type=Path, help="with --install: the new site folder to create")
    p.set_defaults(func=_bundle)
