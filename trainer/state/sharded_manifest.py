"""The manifest of a sharded checkpoint (:mod:`tuneup.trainer.state.sharded`): the SHA-256 of
every file of the directory, written last by the save, checked before anything is loaded.

A single-file checkpoint carries its checksum in the file (checkpoint_write.py); a
directory has one file per rank and writer thread, so its checksums live beside them in
``tuneup-sha256.json`` (:data:`MANIFEST`). No manifest means the save did not finish (it is
written after every rank's files, just before the rename); a file whose bytes do not hash
to the manifest's value is damaged. Either is
:class:`~tuneup.trainer.state.checkpoint_file.UnreadableCheckpoint`, so ``resume=auto``
falls back to the previous checkpoint, as for a single file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tuneup.trainer.state.checkpoint_file import UnreadableCheckpoint

MANIFEST = "tuneup-sha256.json"


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, hashes: dict[str, str]) -> None:
    with open(directory / MANIFEST, "w") as f:
        json.dump({"sha256": hashes}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def verify(path: Path) -> None:
    """Raise ``UnreadableCheckpoint`` unless every file of the manifest is there, intact."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise UnreadableCheckpoint(
            f"{path} is not a complete sharded checkpoint: it has no {MANIFEST} (written last, "
            "so its save did not finish)"
        )
    try:
        hashes = json.loads(manifest.read_text())["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableCheckpoint(f"{manifest} is corrupt: {exc}") from None
    for name, expected in sorted(hashes.items()):
        file = path / name
        if not file.is_file():
            raise UnreadableCheckpoint(f"{path} is incomplete: {name} is missing")
        actual = sha256(file)
        if actual != expected:
            raise UnreadableCheckpoint(
                f"{file} is corrupt: its bytes do not match the SHA-256 it was written with "
                f"(recorded {expected[:12]}..., found {actual[:12]}...); damaged on disk or in a "
                "copy"
            )
