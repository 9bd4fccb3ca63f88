"""The resumable store of a mining run under OUT: manifest, atomic part files, done marker, report folder.

A run killed at any point resumes from its part files when rerun with the same settings (the manifest).
Nothing here writes over what mining did not create: OUT must be new, empty or a mining run's own folder, and
never one of the inputs (checked by `grpo.outputs.output_folder`); every file is written to a temporary name
and renamed into place (`grpo.outputs.atomic_write`, `publish_dataset`); a folder being rebuilt is set aside
until the new one is complete (`grpo.outputs.set_aside`). A damaged file of a run (manifest, part, done marker) is an error naming it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from grpo.errors import UserError
from grpo.outputs import atomic_write
from ocr_rewards.jsonl import read_json_object, read_lines
from grpo.rollouts.sampling import INDEX


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

    def is_run(self) -> bool:
        """True when OUT holds a mining run's manifest that parses (a folder mine made, to resume)."""
        return _parses(self.manifest)

    def is_finished(self) -> bool:
        """True when OUT holds a finished mining output: its `mining/done.json` parses."""
        return _parses(self.done)

    def read_parts(self) -> dict[int, dict]:
        """Records of every mined prompt by pool index; a prompt in two part files, or a damaged line, is an error."""
        records, source = {}, {}
        for path in sorted(self.parts.glob("part-*.jsonl")):
            for number, rec, problem in read_lines(path, "mining part"):
                if problem is None and not (isinstance(rec, dict) and isinstance(rec.get(INDEX), int)):
                    problem = f"not a record with an integer {INDEX}"
                if problem:
                    raise MiningError(f"{path} is damaged: line {number}: {problem}")
                if rec[INDEX] in records:
                    raise MiningError(f"prompt {rec[INDEX]} is in both {source[rec[INDEX]]} and {path} "
                                      "(were two runs writing to the same OUT?)")
                records[rec[INDEX]], source[rec[INDEX]] = rec, path
        return records

    def write_part(self, records: list[dict]) -> None:
        first = min(rec[INDEX] for rec in records)
        atomic_write(self.parts / f"part-{first:09d}.jsonl", "".join(json.dumps(r) + "\n" for r in records))


    def read_done(self) -> dict:
        """The done marker: `manifest` (with its `shard` [I, N]) and `selection`; a `MiningError` naming the
        file when it is missing or damaged."""
        if not self.done.is_file():
            raise MiningError(f"{self.out}: not finished (no mining/done.json); rerun mine on it")
        done = read_json(self.done)
        shard = done.get("manifest", {}).get("shard") if isinstance(done.get("manifest"), dict) else None
        selection = done.get("selection")
        if not (isinstance(shard, list) and len(shard) == 2 and all(_is_int(v) for v in shard)
                and 0 <= shard[0] < shard[1] and isinstance(selection, dict)):
            raise MiningError(f"{self.done} is damaged (needs manifest.shard [I, N] with 0 <= I < N, and selection)")
        min_std, keep = selection.get("min_std"), selection.get("keep")
        if not (isinstance(selection.get("rank"), dict) and isinstance(min_std, (int, float))
                and not isinstance(min_std, bool) and 0 <= min_std < math.inf
                and (keep is None or (_is_int(keep) and keep >= 1))):
            raise MiningError(f"{self.done} is damaged (selection needs rank, a finite min_std >= 0 and keep, "
                              "an integer >= 1 or null)")
        return done

    def publish_dataset(self, staged: Path) -> None:
        """Move the dataset files saved in `staged` into OUT, replacing the old ones (done.json goes first:
        until it is written again the folder reads as unfinished)."""
        self.done.unlink(missing_ok=True)
        new = {path.name for path in staged.iterdir()}
        for path in staged.iterdir():
            os.replace(path, self.out / path.name)
        for old in self.out.glob("data-*.arrow"):
            if old.name not in new:
                old.unlink()
        staged.rmdir()


def read_json(path: Path) -> dict:
    """A JSON object file of a run; a `MiningError` naming it when it is not one."""
    return read_json_object(path, MiningError)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parses(path: Path) -> bool:
    try:
        read_json(path)
    except MiningError:
        return False
    return True


def is_empty_folder(path: Path) -> bool:
    """True for a folder that does not exist yet or holds nothing; a `MiningError` when `path` is a file."""
    if path.exists() and not path.is_dir():
        raise MiningError(f"output {path} is a file, not a folder", setting="out")
    return not path.exists() or not any(path.iterdir())


def pool_fingerprint(ds) -> str:
    digest = hashlib.sha256()
    for row in ds.select_columns([INDEX, "prompt", "target", "task_type"]):
        digest.update(json.dumps(row, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def check_manifest(run: MiningStore, manifest: dict) -> None:
    """Resume only a run with the same settings; start one only in a new or empty folder."""
    if run.manifest.is_file():
        old = read_json(run.manifest)
        diff = [f"{key}: {old.get(key)!r} then, {manifest[key]!r} now" for key in manifest if old.get(key) != manifest[key]]
        if diff:
            raise MiningError(f"{run.out} holds a mining run with other settings ({'; '.join(diff)}); "
                              "rerun with the same settings to resume, or choose another output folder",
                              setting="out")
        return
    if not is_empty_folder(run.out) and {p.name for p in run.out.iterdir()} != {run.work.name}:
        # only mining/ without its manifest: a run killed before writing it, ours to start again
        raise MiningError(f"output {run.out} is not empty and holds no mining run (no mining/manifest.json); "
                          "mine writes only into a new or empty folder, or one of its own runs to resume it",
                          setting="out")
    run.parts.mkdir(parents=True, exist_ok=True)
    atomic_write(run.manifest, json.dumps(manifest, indent=2) + "\n")
