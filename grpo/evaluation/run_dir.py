"""A GRPO run folder: the one module that knows its files and finds them again (docs/style.md point 12).

    OUTPUT/.gravity-grpo.json   the marker of a run folder train made (`RUN_STAMP`, `grpo.outputs.mark`)
    OUTPUT/run_config.json      the full config of the run (read back to re-measure its checkpoints)
    OUTPUT/metrics.jsonl        the trainer's log history, one entry per line
    OUTPUT/wall_time.json       seconds per phase and the total
    OUTPUT/reward_curve.png     training reward per task versus step
    OUTPUT/tpf_drift.jsonl      one line per TPF probe: TPF, held-out reward, ... (`grpo.evaluation.drift`)
    OUTPUT/tpf_drift.png        TPF and held-out reward versus step
    OUTPUT/probe_rows.jsonl     one line per probe: its per-prompt records (for paired before/after figures)
    OUTPUT/checkpoint-N/        TRL checkpoints, each a joint checkpoint (docs/spec.md §2)
    OUTPUT/README.md            the model card (`grpo.evaluation.model_card`)
    OUTPUT/model.safetensors, config.json, ...  the final model: a joint checkpoint at the root, so the run
                                folder itself is a `--model`

Every file of the folder has one mode, the umask's reading of 0666 (`settle_modes`): safetensors writes
weights through a temporary file, which is created 0600.

Only the main process writes (the callers check `is_world_process_zero`); every write replaces a file whole
or appends one line.

Example:
    >>> run = RunDir("runs/demo")                              # doctest: +SKIP
    >>> [step for step, _ in run.checkpoints()]                # doctest: +SKIP
    [40, 80]
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from grpo.errors import quoted
from ocr_rewards.jsonl import read_json_object

RUN_STAMP = "gravity-grpo train"  # the marker a run folder carries (grpo.outputs.mark)
RUN_CONFIG = "run_config.json"
METRICS_JSONL = "metrics.jsonl"
WALL_TIME = "wall_time.json"
REWARD_PNG = "reward_curve.png"
DRIFT = "tpf_drift"
DRIFT_JSONL = f"{DRIFT}.jsonl"
DRIFT_PNG = f"{DRIFT}.png"
PROBE_ROWS = "probe_rows.jsonl"
MODEL_CARD = "README.md"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def _write_jsonl(path: Path, records: Iterable[dict]) -> None:
    """Replace `path` whole (a reader never sees half a file; the temporary name is unique: `grpo.outputs`)."""
    from grpo.outputs import atomic_write

    atomic_write(path, "".join(json.dumps(r) + "\n" for r in records))


def _metric_problem(record: dict) -> str | None:
    """Why a `metrics.jsonl` record is damaged: a metric (`reward`, or a name with a '/': `tpf/mean`, ...) that
    is not a number (a list, a string, a bool), which the drift log and the plots would copy or fail on."""
    for key, value in record.items():
        if (key == "reward" or "/" in key) and value is not None and \
                (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{key} {quoted(value, 60)} is not a number"
    return None


def _read_jsonl(path: Path, check: Callable[[dict], str | None] | None = None) -> list[dict]:
    """The records of a run's jsonl file ([] when absent), each also checked by `check` (a problem or None); a
    `ConfigError` naming the first damaged line."""
    from grpo.yaml_config import ConfigError
    from ocr_rewards.jsonl import read_lines

    if not path.is_file():
        return []
    records = []
    for number, record, problem in read_lines(path, "run file"):
        if problem is None and not isinstance(record, dict):
            problem = "not a JSON object"
        elif problem is None and "step" in record and (isinstance(record["step"], bool)
                                                        or not isinstance(record["step"], int)):
            problem = f"step {record['step']!r} is not an integer"
        elif problem is None and check is not None:
            problem = check(record)
        if problem:
            raise ConfigError(f"{path} is damaged: line {number}: {problem}")
        records.append(record)
    return records


def settle_modes(folder: str | Path) -> None:
    """Give every file under `folder` the mode a plain `open()` gives: 0666 less the umask."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


class RunDir:
    """The files of one GRPO run under `path` (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def file(self, name: str) -> Path:
        return self.path / name

    def is_run(self) -> bool:
        """True when the folder holds a run written by this package."""
        return self.file(RUN_CONFIG).is_file()

    # --- config and wall time ---
    def write_config(self, config_json: str) -> None:
        from grpo.outputs import atomic_write

        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.file(RUN_CONFIG), config_json)

    def read_config(self) -> dict[str, Any]:
        """The run's config, or {} for a folder without one; a `ConfigError` naming a damaged one."""
        from grpo.yaml_config import ConfigError

        path = self.file(RUN_CONFIG)
        return read_json_object(path, ConfigError) if path.is_file() else {}

    def write_wall_time(self, split: dict[str, float]) -> None:
        from grpo.outputs import atomic_write

        atomic_write(self.file(WALL_TIME), json.dumps(split, indent=2) + "\n")

    # --- the log history ---
    def write_metrics(self, history: list[dict], written: int) -> int:
        """Bring `metrics.jsonl` up to `history`: append the last entry when `written` entries are already
        there, else rewrite the whole history (a process's first write, `written` -1, e.g. after resume).
        Returns the count written."""
        path = self.file(METRICS_JSONL)
        if written == len(history) - 1:
            with path.open("a") as f:
                f.write(json.dumps(history[-1]) + "\n")
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            _write_jsonl(path, history)
        return len(history)

    def read_metrics(self) -> list[dict]:
        return _read_jsonl(self.file(METRICS_JSONL), _metric_problem)

    # --- the TPF probe ---
    def write_drift(self, records: list[dict], name: str = DRIFT, title: str | None = None,
                    tpf_floor: float | None = None) -> Path:
        """Rewrite `<name>.jsonl` from the probe records and redraw `<name>.png` (with the `tpf_floor` line);
        return the PNG path."""
        from grpo.evaluation.plots import plot_drift

        self.path.mkdir(parents=True, exist_ok=True)
        _write_jsonl(self.file(f"{name}.jsonl"), records)
        return plot_drift(records, self.file(f"{name}.png"), tpf_floor=tpf_floor, **({"title": title} if title else {}))

    def write_probe_rows(self, step: int, rows: list[dict]) -> None:
        """Record one probe's per-prompt records; lines of later steps (an earlier attempt before a resume) go."""
        kept = [line for line in self.read_probe_rows() if line["step"] < step]
        self.path.mkdir(parents=True, exist_ok=True)
        _write_jsonl(self.file(PROBE_ROWS), kept + [{"step": step, "rows": rows}])

    def read_probe_rows(self) -> list[dict]:
        """[{step, rows}] per probe, by step."""
        return _read_jsonl(self.file(PROBE_ROWS))

    # --- the final model ---
    def write_model_card(self, text: str) -> None:
        from grpo.outputs import atomic_write

        atomic_write(self.file(MODEL_CARD), text)

    # --- checkpoints ---
    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, folder) of the run's `checkpoint-N` folders, by step."""
        if not self.path.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.path.iterdir()
                 if p.is_dir() and (m := _CHECKPOINT.fullmatch(p.name))]
        return sorted(found)
