"""Download the wheels of gpu/wheels.txt for one Python version (manylinux x86_64), no dependencies resolved.

    python3 gpu/wheels.py                        # .whl/ for the lent H200's Python 3.12 (`make gpu-wheels`)
    python3 gpu/wheels.py --python 3.11 --dest runs/gpu-rehearsal/whl

The folder is emptied first, so it never holds two versions of a package (that stops the whole install).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "gpu" / "wheels.txt"
LIMIT_MIB = 60  # what travels to the device is at most 64 MiB a call; the rest is the checkout (~11 MiB)
# pip matches manylinux tags exactly: the ones the listed wheels are published under
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def pinned() -> dict[str, str]:
    """Normalised name -> version of every line of gpu/wheels.txt."""
    pins = {}
    for line in LIST.read_text().splitlines():
        spec = line.split("#")[0].strip()
        if spec:
            name, version = spec.split("==")
            pins[normalise(name)] = version
    return pins


def normalise(name: str) -> str:
    """A distribution name as pip compares it (PEP 503), e.g. `RapidFuzz` and `rapidfuzz` alike."""
    return re.sub(r"[-_.]+", "-", name).lower()


def held(folder: Path) -> dict[str, str]:
    """Normalised name -> version of the wheels in `folder`."""
    return {normalise(f.name.split("-")[0]): f.name.split("-")[1] for f in folder.glob("*.whl")}


def download(dest: Path, python: str) -> int:
    """Fill `dest` with the listed wheels for CPython `python` (e.g. "3.12"); return their size in bytes."""
    shutil.rmtree(dest, ignore_errors=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python, "--implementation", "cp", *platforms, "-d", str(dest),
                    "-r", str(LIST)], check=True)
    if held(dest) != pinned():
        raise SystemExit(f"error: {dest} holds {sorted(held(dest).items())}, not the list of {LIST}")
    return sum(f.stat().st_size for f in dest.glob("*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="CPython version the wheels are for (default: the H200's)")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="folder to fill (emptied first)")
    args = parser.parse_args()
    size = download(args.dest, args.python)
    print(f"{args.dest}: {len(pinned())} wheels for Python {args.python}, {size / 2**20:.1f} MiB "
          f"(limit {LIMIT_MIB} MiB)")
    if size > LIMIT_MIB * 2**20:
        raise SystemExit(f"error: the wheels exceed {LIMIT_MIB} MiB; they travel with the checkout")


if __name__ == "__main__":
    main()
