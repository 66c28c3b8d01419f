"""The SGLang versions the install paths know (`--sglang VERSION`), and what each one pins.

Standard library only: env/setup_env.sh runs setup with the system python before any venv
exists. `python -m k26_ddtree.repro.sglang_versions [VERSION]` prints the stack a version
installs, or refuses an unknown one with one line and exit 2 (env/quickstart.sh asks it first).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from k26_ddtree.errors import UserError

# The version the shipped patch set and the deploy profiles are made for.
DEFAULT = "0.5.11"


@dataclass(frozen=True)
class KnownFailure:
    """Hardware an SGLang version is known to fail on: render, install and env/quickstart.sh refuse
    that version for the shipped profiles of that hardware (k26_ddtree/deploy/pairings.py)."""

    hardware: str
    profiles: tuple[str, ...]  # the shipped profiles for that hardware, and the profiles extending them
    reports: str  # what fails there, naming the upstream reports


@dataclass(frozen=True)
class SglangPins:
    """One SGLang version and the exact releases installed with it."""

    sglang: str
    # torch, torchvision and torchaudio as the sglang wheel's Requires-Dist pins them (torchvision:
    # the release built against that torch).
    torch: str
    torchvision: str
    torchaudio: str
    # The CPython versions PyPI has sglang wheels for (cp310..cp313 for both known versions).
    pythons: tuple[tuple[int, int], ...]
    # sglang-kernel's builds by compute capability: sm90 for sm_90, sm100 for every other GPU.
    kernel_sms: tuple[str, ...]
    # The offline bundle's packages: what the sglang server with the triton attention backend
    # imports beyond a CUDA image that already has torch, triton, numpy, safetensors, requests,
    # aiohttp, uvloop, psutil, pillow, ... (docs/sglang-on-the-h200.md).
    bundle: tuple[str, ...]
    fails_on: tuple[KnownFailure, ...] = ()

    def bundled(self, name: str) -> str:
        """The bundle's pinned version of `name` (e.g. "sglang-kernel")."""
        for spec in self.bundle:
            pinned, version = spec.split("==", 1)
            if pinned == name:
                return version
        raise KeyError(name)

    def stack(self) -> str:
        return f"torch {self.torch} + sglang {self.sglang}"


# Both versions serve fastapi 0.136 (newer ones import opentelemetry), starlette, uvicorn and
# pydantic as below, openai 2.6.1 (their pin) and the rest of sglang's module-level imports.
_SERVING = (
    "fastapi==0.136.0",
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "typing-inspection==0.4.5",
    "annotated-types==0.8.0",
    "python-multipart==0.0.34",
    "orjson==3.13.0",
    "pybase64==1.5.1",
    "pyzmq==27.3.0",
    "msgspec==0.23.0",
    "setproctitle==1.3.8",
    "openai==2.6.1",
    "distro==1.9.0",
    "sniffio==1.3.1",
    "jiter==0.19.0",
    "partial-json-parser==0.2.1.1.post7",
    "ipython==9.18.1",
    "traitlets==5.16.1",
    "compressed-tensors==0.20.1",
    "loguru==0.7.3",
    "gguf==0.19.0",
    "dill==0.4.1",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "soundfile==0.13.1",
    "cffi==2.1.1",
    "pycparser==3.12",
)

PINS = {pins.sglang: pins for pins in (
    SglangPins(
        sglang="0.5.11", torch="2.11.0", torchvision="0.26.0", torchaudio="2.11.0",
        pythons=((3, 10), (3, 11), (3, 12), (3, 13)), kernel_sms=("90", "100"),
        # The GPU image's transformers 5.17 breaks `import sglang` 0.5.11 ("'qwen3_asr' is already
        # used by a Transformers config"), hence its own transformers and tokenizers.
        bundle=(
            "sglang==0.5.11",
            "sglang-kernel==0.4.2",
            "flashinfer-python==0.6.8.post1",
            "transformers==5.6.0",
            "tokenizers==0.22.2",
            *_SERVING,
            "apache-tvm-ffi==0.1.15.post2",
        )),
    SglangPins(
        sglang="0.5.17", torch="2.11.0", torchvision="0.26.0", torchaudio="2.11.0",
        pythons=((3, 10), (3, 11), (3, 12), (3, 13)), kernel_sms=("90", "100"),
        # sglang pins transformers 5.12.1, which takes tokenizers <= 0.23.0 (the image has 0.23.2);
        # server_args imports xgrammar (function_call/inkling_detector.py) whatever the grammar
        # backend; DeepGEMM moved out of sglang-kernel into sgl-deep-gemm; sglang, sgl-deep-gemm
        # and xgrammar all pin apache-tvm-ffi 0.1.11.
        bundle=(
            "sglang==0.5.17",
            "sglang-kernel==0.4.5",
            "sgl-deep-gemm==0.1.5.post1",
            "flashinfer-python==0.6.15.post1",
            "transformers==5.12.1",
            "tokenizers==0.22.2",
            "xgrammar==0.2.1",
            *_SERVING,
            "apache-tvm-ffi==0.1.11",
        ),
        # Both reports are of other models on B300 (Kimi-K3, GLM-5). Every unquantized BF16 linear takes
        # that GEMM (layers/quantization/unquant.py), the DFlash drafter's among them.
        fails_on=(KnownFailure(
            hardware="8x B300 (sm_103)",
            profiles=("nvlink-tp8-nvls",),
            reports="--bf16-gemm-backend auto picks the CuTeDSL TGV BF16 GEMM on SM103, which raises Xid 13 "
                    "\"CTA Not Present\" on B300 with flashinfer 0.6.15.post1 (SGLang #34340, open), and draft "
                    "CUDA-graph capture on sm_103 crashes in an sm100f trtllm batched GEMM since 0.5.12's "
                    "flashinfer (SGLang #25563)",
        ),)),
)}


def known() -> str:
    return ", ".join(f"{v} (default)" if v == DEFAULT else v for v in PINS)


def pins_for(version: str | None) -> SglangPins:
    """The pins of `version` (None: the default); UserError naming the known versions otherwise."""
    if version is None:
        return PINS[DEFAULT]
    if version not in PINS:
        shown = version if re.fullmatch(r"[\w.+-]{1,40}", version) else repr(version[:40])
        raise UserError(f"--sglang {shown}: not a version k26-ddtree installs; known: {known()}")
    return PINS[version]


def main(argv: list[str]) -> int:
    try:
        pins = pins_for(argv[0] if argv else None)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    print(pins.stack())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
