"""The one CLI boundary's contract, for tests: a refused command exits 2 with one `error:` message naming its
culprits, no traceback, and leaves its input files byte for byte as they were."""
from __future__ import annotations

import re
from pathlib import Path

from grpo.cli import main


def snapshot(*paths: Path) -> dict[str, bytes]:
    """The bytes of every file under `paths` (files or folders), by path."""
    files = [q for p in paths for q in ([p] if p.is_file() else sorted(p.rglob("*"))) if q.is_file()]
    return {str(f): f.read_bytes() for f in files}


def refused(capsys, argv: list[str], *culprits: str, inputs: tuple[Path, ...] = ()) -> str:
    """Run `argv`: exit 2, one `error:` message holding every culprit, no traceback, inputs byte for byte."""
    before = snapshot(*inputs)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert len(re.findall(r"^error: ", err, flags=re.MULTILINE)) == 1, err
    assert "Traceback" not in out + err
    message = err[err.index("error: "):]
    for culprit in culprits:
        assert culprit in message, (culprit, message)
    assert snapshot(*inputs) == before
    return message
