"""The resumable store of a mining run under OUT: manifest, atomic part files, done marker, report folder.

A run killed at any point resumes from its part files when rerun with the same settings (the manifest).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from grpo.errors import UserError
from grpo.mining.selection import INDEX


class MiningError(UserError, ValueError):
    """A mining run that cannot go on as asked (mismatched resume, incomplete or overlapping shards)."""


class MiningStore:
    """The files of one mining run under OUT (see the module docstring)."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.work = self.out / "mining"
        self.parts = self.work / "parts"
        self.manifest = self.work / "manifest.json"
        self.done = self.work / "done.json"
        self.report = self.out / "report"

    def read_parts(self) -> dict[int, dict]:
        """Records of every mined prompt by pool index; a prompt in two part files is an error."""
        records, source = {}, {}
        for path in sorted(self.parts.glob("part-*.jsonl")):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec[INDEX] in records:
                    raise MiningError(f"prompt {rec[INDEX]} is in both {source[rec[INDEX]]} and {path} "
                                      "(were two runs writing to the same OUT?)")
                records[rec[INDEX]], source[rec[INDEX]] = rec, path
        return records

    def write_part(self, records: list[dict]) -> None:
        first = min(rec[INDEX] for rec in records)
        atomic_write(self.parts / f"part-{first:09d}.jsonl", "".join(json.dumps(r) + "\n" for r in records))


def atomic_write(path: Path, text: str) -> None:
    """Write, fsync, then rename: a reader (or a rerun after SIGKILL) sees the whole file or none."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pool_fingerprint(ds) -> str:
    digest = hashlib.sha256()
    for row in ds.select_columns([INDEX, "prompt", "target", "task_type"]):
        digest.update(json.dumps(row, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def check_manifest(run: MiningStore, manifest: dict) -> None:
    if run.manifest.is_file():
        old = json.loads(run.manifest.read_text())
        diff = [f"{key}: {old.get(key)!r} then, {manifest[key]!r} now" for key in manifest if old.get(key) != manifest[key]]
        if diff:
            raise MiningError(f"{run.out} holds a mining run with other settings ({'; '.join(diff)}); "
                              "rerun with the same settings to resume, or choose another output folder",
                              setting="out")
        return
    run.parts.mkdir(parents=True, exist_ok=True)
    atomic_write(run.manifest, json.dumps(manifest, indent=2) + "\n")
