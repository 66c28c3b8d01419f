"""Turn a trained proving-ground target folder into an emulated one.

Every file but config.json is hard-linked (copied where the two folders are on different file
systems); config.json names the emulated class first and carries a `k26_emulator` block: the box,
its costs (calibration.Costs, fitted now) and `subtract_us` per mode, the step time the unemulated
pair already spends on the device, so the served folder says exactly what it emulates.

    python -m proving_ground.emulator.folder --target DIR --out DIR --box NAME [--rho R]
        [--subtract-decode-us US] [--subtract-verify-us US] [--subtract-extend-us US]

Serve it with SGLANG_EXTERNAL_MODEL_PACKAGE=proving_ground.emulator and the checkout on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from proving_ground.emulator.calibration import CalibrationError, OneLineParser, load

EMULATED_ARCH = "K26EmulatedDeepseekV3ForCausalLM"
TARGET_ARCH = "DeepseekV3ForCausalLM"
EXTERNAL_PACKAGE = "proving_ground.emulator"
EXTERNAL_PACKAGE_ENV = "SGLANG_EXTERNAL_MODEL_PACKAGE"
# model.py logs it at load: a server log without it serves the plain target.
EMULATOR_LOG_MARK = "k26 emulator:"


def emulation(models: Path) -> dict | None:
    """The k26_emulator block of a models folder's target (None: the plain target)."""
    try:
        return json.loads((models / "target" / "config.json").read_text()).get("k26_emulator")
    except (OSError, ValueError, AttributeError):
        return None


def emulated_config(config: dict, box: str, rho: float | None, subtract_us: dict) -> dict:
    """The target's config.json made emulated: architectures and the k26_emulator block."""
    if config.get("architectures") != [TARGET_ARCH]:
        raise CalibrationError(f"the target's architectures are {config.get('architectures')}, not [{TARGET_ARCH!r}]")
    if not all(v >= 0 for v in subtract_us.values()):  # NaN fails this too
        raise CalibrationError(f"subtract_us must be >= 0, got {subtract_us}")
    block = {"box": box, "costs": load(box, rho).to_block(), "subtract_us": dict(subtract_us)}
    return dict(config, architectures=[EMULATED_ARCH, TARGET_ARCH], k26_emulator=block)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


def make_emulated(target: Path, out: Path, box: str, rho: float | None, subtract_us: dict) -> dict:
    """Write `out` (must not exist) from `target`; returns the new config."""
    config = emulated_config(json.loads((target / "config.json").read_text()), box, rho, subtract_us)
    if out.exists():
        raise CalibrationError(f"{out} already exists")
    out.mkdir(parents=True)
    for path in target.iterdir():
        if path.is_file() and path.name != "config.json":
            _link_or_copy(path, out / path.name)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return config


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m proving_ground.emulator.folder", description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="a trained target folder (config.json, weights)")
    parser.add_argument("--out", type=Path, required=True, help="the emulated folder to create")
    parser.add_argument("--box", required=True, help="a box under proving_ground/emulator/boxes")
    parser.add_argument("--rho", type=float, help="routing correlation in 0..1 (default: the box's)")
    for mode, flag in (("decode", "decode"), ("target_verify", "verify"), ("extend", "extend")):
        parser.add_argument(f"--subtract-{flag}-us", type=float, default=0.0, dest=mode,
                            help=f"µs the unemulated pair already spends per {mode} step (default 0)")
    args = parser.parse_args(argv)
    if args.rho is not None and not 0 <= args.rho <= 1:
        parser.error(f"--rho must be in 0..1, got {args.rho}")
    if not (args.target / "config.json").is_file():
        parser.error(f"{args.target} has no config.json")
    subtract = {m: getattr(args, m) for m in ("decode", "target_verify", "extend")}
    try:
        config = make_emulated(args.target, args.out, args.box, args.rho, subtract)
    except CalibrationError as err:
        parser.error(str(err))
    except OSError as err:
        parser.error(f"cannot write {args.out}: {err.strerror or err}")
    print(json.dumps(config["k26_emulator"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
