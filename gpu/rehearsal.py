"""`make gpu-rehearsal`: the GPU check on this CPU, in a throwaway environment built like the lent H200's.

`make gpu-wheels` runs `fetch` (the one step that uses an index), beside filling .whl/:
1. the wheels of gpu/wheels.txt again, for this interpreter's Python (3.11 here: no CPU build of torch for the
   H200's 3.12 lies on this disk): the same names and versions as .whl/, into runs/gpu-rehearsal/whl;
2. the device image's packages that the package and those wheels need, resolved by pip (the image's published
   versions where gpu/device-image.txt gives one) into runs/gpu-rehearsal/image. Not at the image's versions:
   `UNPINNED`.
`make gpu-rehearsal` (`main`) then uses no index:
3. a fresh venv with those installed offline (`--no-index`); every package that the project or a carried wheel
   needs must be on the image's list or among the wheels, else the rehearsal stops naming it;
4. the check itself, `python -m grpo.gpu_check --device cpu --wheels runs/gpu-rehearsal/whl`, which installs the
   wheels with `--no-index --no-deps --target` as on the device; report in runs/gpu-rehearsal/report.json.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wheels import LIST, ROOT, download, held, normalise, pinned  # noqa: E402

RUN = ROOT / "runs" / "gpu-rehearsal"
IMAGE_LIST = ROOT / "gpu" / "device-image.txt"
# The image's versions this CPU cannot have: torch is the CPU build 2.13.0 on this disk (the H200 has 2.11.0
# built for CUDA 13; PyPI has no CPU build of 2.11), torchvision / torchaudio / triton follow torch, and the
# image's numpy 2.5.2 needs Python >= 3.12.
UNPINNED = frozenset({"torch", "torchvision", "torchaudio", "triton", "numpy"})
TORCH = "torch==2.13.0+cpu"
OURS = frozenset({"gravity-grpo", "ocr-rewards"})


def image() -> dict[str, str | None]:
    """Normalised name -> published version (None where not published) of the device image's packages."""
    out = {}
    for line in IMAGE_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            out[normalise(name)] = version or None
    return out


def outside_image(wheel_dir: Path) -> list[str]:
    """Packages the project or a carried wheel needs that are neither carried nor on the image's list (run in the
    rehearsal venv: it reads requirement markers with its `packaging`)."""
    import tomllib
    import zipfile

    from packaging.requirements import Requirement

    carried = {}
    for wheel in wheel_dir.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        carried[normalise(wheel.name.split("-")[0])] = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    todo = [r for p in (ROOT / "pyproject.toml", ROOT / "rewards" / "pyproject.toml")
            for r in tomllib.loads(p.read_text())["project"]["dependencies"]]
    seen, missing, known = set(OURS), [], image()
    while todo:
        req = Requirement(todo.pop())
        name = normalise(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        if name in carried:
            todo += carried[name]
        elif name not in known:
            missing.append(name)
    return sorted(missing)


def pip(python: Path | str, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", *args], check=True)


WHEELS, IMAGE = RUN / "whl", RUN / "image"


def fetch() -> None:
    """Steps 1 and 2 (PyPI): what the rehearsal installs offline."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    download(WHEELS, python)
    print(f"gpu-rehearsal: {WHEELS} holds the wheels of .whl/ for Python {python}", flush=True)
    pins = RUN / "image-pins.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in image().items() if v and n not in UNPINNED))
    pip(sys.executable, "download", "-q", "-d", str(IMAGE), "-c", str(pins), TORCH, "torchvision",
        *map(str, sorted(WHEELS.glob("*.whl"))), str(ROOT / "rewards"), str(ROOT))


def main() -> int:
    if held(ROOT / ".whl") != pinned() or held(WHEELS) != pinned() or not any(IMAGE.glob("*.whl")):
        raise SystemExit(f"error: .whl/ or {RUN} does not hold the wheels of {LIST} and the image's packages: "
                         "run `make gpu-wheels` first")
    wheels, image_dir = WHEELS, IMAGE
    env_dir = RUN / "venv"
    shutil.rmtree(env_dir, ignore_errors=True)
    venv.create(env_dir, with_pip=True)
    env_python = env_dir / "bin" / "python"
    skip = set(pinned()) | OURS
    files = [f for f in sorted(image_dir.glob("*.whl")) if normalise(f.name.split("-")[0]) not in skip]
    pip(env_python, "install", "-q", "--no-index", "--no-deps", *map(str, files))
    missing = subprocess.run([str(env_python), __file__, "--outside-image", str(wheels)], check=True,
                             capture_output=True, text=True).stdout.split()
    if missing:
        raise SystemExit(f"error: needed, not on the device image's list and not carried: {', '.join(missing)}; "
                         f"add them to {LIST}")
    extra = sorted({normalise(f.name.split("-")[0]) for f in files} - set(image()))
    print(f"gpu-rehearsal: {len(files)} image packages installed offline; every need is on the image or carried"
          + (f" (pulled in by newer releases of image packages, not on its list: {', '.join(extra)})" if extra else ""),
          flush=True)
    checkout = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = subprocess.run([str(env_python), "-m", "grpo.gpu_check", "--device", "cpu", "--wheels", str(wheels),
                           "--out", str(RUN)], env=checkout, cwd=ROOT).returncode
    shutil.rmtree(env_dir)  # throwaway (~2 GB); the downloads in runs/gpu-rehearsal/image stay for the next run
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--outside-image"]:
        print("\n".join(outside_image(Path(sys.argv[2]))))
        sys.exit(0)
    if sys.argv[1:2] == ["--fetch"]:
        fetch()
        sys.exit(0)
    sys.exit(main())
