"""Checkpoints that appear only once complete, and the one choice of the checkpoint a run resumes from.

`save_aside` has the trainer write `checkpoint-N` inside a new hidden folder of the run folder
(`.checkpoint-N.<random>.saving`, made by `grpo.outputs.temporary`), then renames it to `checkpoint-N` once
every process has written its files: Ctrl-C or a kill at any moment leaves the earlier checkpoints as they were,
and at worst that hidden folder. `resume_point` picks the last complete checkpoint (`is_complete`) and names
each incomplete folder it skips, in the dry run and the run alike.

Example:
    >>> resume_point("runs/demo", True)                          # doctest: +SKIP
    'runs/demo/checkpoint-80'
"""
from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo.evaluation.run_dir import RunDir
from grpo.outputs import temporary
from grpo.yaml_config import ConfigError

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"  # TRL writes it last of a checkpoint's files
SAVING = "saving"  # the kind in the name of a checkpoint being written
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin",
           "latest")  # `latest`: DeepSpeed's pointer to its own weight shards
INSIDE_SAVE: list[Callable[[Path], None]] = []  # called with the folder being written, its weights saved (tests)


TORCH_FILES = ("optimizer.pt", "scheduler.pt", "rng_state*.pth", "pytorch_model.bin", "training_args.bin")


def damage(folder: Path) -> str | None:
    """Why `folder` is no checkpoint TRL can resume from, or None: a missing trainer state or weights, or a file
    that resume reads and that does not parse (a trainer state TRL cannot load, a safetensors header that is
    damaged, a torch file that is not a whole archive: a save cut short)."""
    import zipfile

    from transformers.trainer_callback import TrainerState

    from grpo.errors import CheckpointError
    from grpo.weights import check_weights

    folder = Path(folder)
    if not (folder / STATE_FILE).is_file() or not any((folder / name).is_file() for name in WEIGHTS):
        return f"it lacks {STATE_FILE} or the model weights"
    try:
        TrainerState.load_from_json(str(folder / STATE_FILE))
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError, OSError) as err:
        return f"its {STATE_FILE} does not load ({type(err).__name__}: {str(err)[:80]})"
    try:
        check_weights(folder)
    except CheckpointError as err:
        return str(err)
    for pattern in TORCH_FILES:
        for path in sorted(folder.glob(pattern)):
            if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut one has no directory
                return f"{path.name} is not a whole torch file (cut short?)"
    return None


def is_complete(folder: Path) -> bool:
    """True when `folder` holds a checkpoint TRL can resume from: every file resume reads is there and parses."""
    return damage(folder) is None


def save_aside(trainer: Any, save: Callable[[], None]) -> None:
    """Run `save` (TRL's `_save_checkpoint`) with the trainer's output folder pointed at a new hidden folder, then
    rename the checkpoint it wrote into the run folder; a checkpoint of that step already there is replaced."""
    run = Path(trainer.args.output_dir)
    final = run / f"checkpoint-{trainer.state.global_step}"
    staging = [str(temporary(final, SAVING, folder=True)) if trainer.args.should_save else None]
    if trainer.accelerator.num_processes > 1:  # every process writes its shards into the same folder
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(staging)
    trainer.save_root = staging[0]
    try:
        save()
    finally:
        trainer.save_root = None
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        written, old = Path(staging[0]) / final.name, None
        if final.exists():  # a step saved again after a resume from an earlier checkpoint
            old = temporary(final, "old", folder=True)
            os.rename(final, old)
        os.rename(written, final)
        os.rmdir(staging[0])
        if old is not None:
            shutil.rmtree(old)
        from transformers.trainer_utils import rotate_checkpoints

        rotate_checkpoints(output_dir=str(run), save_total_limit=trainer.args.save_total_limit,
                           best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=False)
    trainer.accelerator.wait_for_everyone()


def inside_save(folder: str | Path) -> None:
    """Where a save may be interrupted in tests: after the weights, before the optimizer and trainer state."""
    for hook in INSIDE_SAVE:
        hook(Path(folder))


def incomplete(output_dir: str | Path) -> list[Path]:
    """The run's checkpoint folders that an interrupted save left: hidden ones being written, and visible ones
    without weights or trainer state (written by an earlier version, or damaged)."""
    run = RunDir(output_dir)
    hidden = sorted(run.path.glob(f".checkpoint-*.{SAVING}")) if run.path.is_dir() else []
    return [*hidden, *(folder for _, folder in run.checkpoints() if not is_complete(folder))]


def resume_point(output_dir: str | Path, resume: str | bool | None) -> str | None:
    """The checkpoint folder `resume` asks for: None without resume; for True the last complete `checkpoint-N`
    of `output_dir` (a warning names every incomplete one skipped); for a path, that folder once it is a
    complete checkpoint. A `ConfigError` (setting `resume`) when there is none."""
    if not resume:
        return None
    if isinstance(resume, str):
        from grpo.paths import check_readable

        folder = check_readable(resume, "resume: checkpoint folder", setting="resume")
        if not folder.is_dir():
            raise ConfigError(f"resume: no checkpoint folder {resume}", setting="resume")
        why = damage(folder)
        if why:
            raise ConfigError(f"resume: {resume} is not a complete checkpoint ({why}: an interrupted save, a "
                              "damaged copy, or no checkpoint at all)", setting="resume")
        return str(folder)
    complete = [folder for _, folder in RunDir(output_dir).checkpoints() if is_complete(folder)]
    skipped = incomplete(output_dir)
    if not complete:
        found = f" (only incomplete ones: {', '.join(p.name for p in skipped)})" if skipped else ""
        raise ConfigError(f"resume: output_dir {output_dir} holds no checkpoint-N folder to resume from{found}",
                          setting="resume")
    if skipped:
        log.warning("resume: skipping incomplete checkpoint folders (an interrupted save, left as they are): %s",
                    ", ".join(str(p) for p in skipped))
    return str(complete[-1])
