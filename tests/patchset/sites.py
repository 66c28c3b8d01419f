"""Sites to patch: the synthetic patch set's patched files, and writable copies of a pristine sglang."""

from __future__ import annotations

import shutil
from pathlib import Path

from k26_ddtree.patchset.pins import load

EDITED = {
    # appended lines; the second file also loses its final newline, which diffs must carry
    "sglang/srt/server_args.py": lambda text: text + b"\nK26_PATCHSET_PROBE = 1\n",
    "sglang/srt/speculative/dflash_utils.py": lambda text: text.replace(b"import ", b"import  ", 1).rstrip(b"\n"),
}
ADDED = {"sglang/srt/speculative/k26_probe.py": b"PROBE = 'added by the synthetic patch set'\n"}


def write_tree(pristine_sglang: Path, tree: Path) -> Path:
    """The synthetic patch set's patched files under tree/sglang/, as `regen --expand` lays them out."""
    for rel, edit in EDITED.items():
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(edit((pristine_sglang / rel).read_bytes()))
    for rel, data in ADDED.items():
        (tree / rel).write_bytes(data)
    return tree


def copy_site(pristine_sglang: Path, dest: Path, patch_sets: tuple[Path, ...]) -> Path:
    """A writable site dir: the sglang dist-info and every file of the directories the synthetic
    patch set or `patch_sets` touch (copying all 2,500 files is slow)."""
    rels = [*EDITED, *ADDED, *(pin.rel for root in patch_sets for pin in load(root).files)]
    dest.mkdir(parents=True, exist_ok=True)
    for dist_info in pristine_sglang.glob("*.dist-info"):
        shutil.copytree(dist_info, dest / dist_info.name)
    for rel_dir in sorted({"sglang", "sglang/srt"} | {rel.rsplit("/", 1)[0] for rel in rels}):
        if not (pristine_sglang / rel_dir).is_dir():
            continue  # a folder a patch set adds
        (dest / rel_dir).mkdir(parents=True, exist_ok=True)
        for path in (pristine_sglang / rel_dir).iterdir():
            if path.is_file():
                shutil.copyfile(path, dest / rel_dir / path.name)
    return dest
