"""`k26-deploy bundle` (offline site archive) and `k26-deploy selftest` (the GPU proving ground)."""

from __future__ import annotations

import argparse
from pathlib import Path

BUNDLE_HELP = """\
Build an offline site archive for a machine without network: the pinned SGLang's
Python source, sglang-kernel trimmed to one sm, flashinfer without its CUTLASS headers,
transformers/tokenizers and the serving deps, plus k26_ddtree, with a SHA256 manifest.
Packages the target already has at the same version (--have, --have-file) stay out.

On the target (python3, tar, sha256sum only):
  tar -xJf k26-site-py3.12-sm90.tar.xz && sh k26-bundle/install.sh /opt/k26-site
or, where k26-deploy runs: k26-deploy bundle --install ARCHIVE --target DIR
"""

SELFTEST_HELP = """\
Run the GPU proving ground (tests/gpu/README.md): real sglang servers on the tiny
DeepseekV3 + DFlash pair, AR reference vs DFLASH and DDTree cells, lossless check.
"""


def register(sub) -> None:
    """Add this family's subcommands to the k26-deploy parser."""
    p = sub.add_parser("bundle", help="build or install the offline site archive (sglang + kernels + deps)",
                       description=BUNDLE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
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

    s = sub.add_parser("selftest", help="run the GPU proving ground (needs a GPU and the offline bundle)",
                       description=SELFTEST_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--gpu", action="store_true", help="required: confirms you mean the GPU run")
    s.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the runner (see --gpu -- --help)")
    s.set_defaults(func=_selftest)


def _bundle(args) -> int:
    from k26_ddtree.errors import UserError
    from k26_ddtree.gpu import bundle

    if args.install:
        if not args.target:
            raise UserError("--install needs --target DIR")
        target = bundle.install(args.install, args.target)
        print(f"installed; use: export PYTHONPATH={target}")
        return 0
    if args.target:
        raise UserError("--target only applies with --install ARCHIVE")
    if not args.max_mib > 0:
        raise UserError(f"--max-mib must be more than 0, got {args.max_mib}")
    for pin in args.have:
        if "==" not in pin:
            raise UserError(f"--have {pin!r}: give NAME==VERSION, e.g. --have torch==2.11.0")
    have = list(args.have)
    if args.have_file:
        have += bundle.read_have_file(args.have_file)
    bundle.build(args.python, args.sm, have, args.out, args.cache or bundle.DEFAULT_CACHE, args.max_mib)
    return 0


def _selftest(args) -> int:
    from k26_ddtree.errors import UserError

    if not args.gpu:
        raise UserError("selftest needs --gpu (it launches sglang servers on this machine's GPU)")
    from k26_ddtree.gpu import e2e

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    return e2e.main(rest)
