"""Run the GPU check: install the carried wheels, run every step in its own process, write the report.

    python3 -m grpo.gpu_check --wheels .whl --device cuda            # report in $OUT, else runs/gpu-check
    python3 -m grpo.gpu_check --list                                 # the steps, one line each
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpo.gpu_check.steps import ALONE, SETTINGS, STEPS

CHECKOUT = Path.cwd()  # the runner starts in the checkout's root (`make gpu-check`, gpu/rehearsal.py)
LOG_TAIL = 25  # lines of a step's log kept in the report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m grpo.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=tuple(SETTINGS), default="cuda", help="where the steps run")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="folder of wheels to install first (pip --no-index --no-deps --target); "
                             "default: use this interpreter's packages as they are")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or CHECKOUT / "runs" / "gpu-check"),
                        help="where report.json and steps.log go (default: $OUT, else runs/gpu-check)")
    parser.add_argument("--only", nargs="+", default=None, metavar="STEP", help="run these steps alone")
    parser.add_argument("--list", action="store_true", help="print the steps and stop")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only or ()) - set(STEPS))
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; the steps are: {', '.join(STEPS)}")
    if args.device == "cuda" and not args.list and shutil.which("nvidia-smi") is None:
        parser.error("--device cuda needs a CUDA GPU (nvidia-smi not found); on CPU: --device cpu, or "
                     "`make gpu-rehearsal`")
    return args


def install(wheels: Path, site: Path) -> dict:
    """Install every wheel of `wheels` into `site` offline, as on the device, then the checkout's two
    distributions built by the carried setuptools (`pip install ./rewards .`, non-editable: the tiny checkpoints
    and recipes ship inside); what was installed and how long."""
    files = sorted(wheels.glob("*.whl"))
    start = time.monotonic()
    if not files:
        return {"ok": False, "seconds": 0.0, "error": f"no wheels in {wheels}: run `make gpu-wheels` where PyPI is "
                                                      f"reachable, and carry the folder"}
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--target", str(site)]
    done = subprocess.run([*pip, *map(str, files)], capture_output=True, text=True)
    if done.returncode == 0:
        done = subprocess.run([*pip, "--no-build-isolation", str(CHECKOUT / "rewards"), str(CHECKOUT)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})
    return {"ok": done.returncode == 0, "seconds": round(time.monotonic() - start, 1),
            "wheels": [f.name for f in files], "target": str(site),
            "error": None if done.returncode == 0 else (done.stdout + done.stderr).strip()[-2000:]}


def run_step(name: str, device: str, work: Path, env: dict, timeout: float) -> dict:
    """One step in its own process group (killed whole on timeout); its report entry."""
    log, result = work / f"{name}.log", work / f"{name}.json"
    start = time.monotonic()
    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, "-m", "grpo.gpu_check.steps", name, "--device", device,
                                  "--work", str(work)], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
            error = None if code == 0 else f"exit code {code}"
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            error = f"timed out after {timeout:.0f} s"
    written = json.loads(result.read_text()) if result.is_file() else {}
    error = written.get("error") or error
    return {"name": name, "ok": error is None, "seconds": round(time.monotonic() - start, 1),
            "figures": written.get("figures", {}), "error": error,
            "log_tail": log.read_text(errors="replace").splitlines()[-LOG_TAIL:]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, function in STEPS.items():
            print(f"{name}: {function.__doc__.splitlines()[0]}")
        return 0
    settings = SETTINGS[args.device]
    names = [n for n in STEPS if args.only is None or n in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    report = {"device": args.device, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "settings": settings, "install": None, "steps": []}
    started, lock = time.monotonic(), threading.Lock()
    (args.out / "steps.log").write_text("")

    def write(entry: dict | None = None) -> None:
        with lock:
            if entry is not None:
                report["steps"].append(entry)
                report["steps"].sort(key=lambda e: names.index(e["name"]))
                with (args.out / "steps.log").open("a") as log:
                    log.write(f"===== {entry['name']} ({'ok' if entry['ok'] else 'FAILED'}, {entry['seconds']} s)\n")
                    log.write((work / f"{entry['name']}.log").read_text(errors="replace") + "\n")
                print(f"{entry['name']}: {'ok' if entry['ok'] else 'FAILED, ' + entry['error']} ({entry['seconds']} s)",
                      flush=True)
            report["seconds"] = round(time.monotonic() - started, 1)
            report["ok"] = (report["install"] or {"ok": True})["ok"] and len(report["steps"]) == len(names) \
                and all(e["ok"] for e in report["steps"])
            (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")

    paths = [str(CHECKOUT / "rewards"), str(CHECKOUT)]
    if args.wheels is not None:  # the steps run what was installed; the checkout only where that failed
        report["install"] = install(args.wheels, work / "site")
        paths = [str(work / "site")] + ([] if report["install"]["ok"] else paths)
    write()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false"}

    def step(name: str) -> None:
        write(run_step(name, args.device, work, env, settings["timeout"]))

    with ThreadPoolExecutor(max_workers=settings["jobs"]) as pool:  # tiny models: several share the device
        list(pool.map(step, [n for n in names if n not in ALONE]))
    for name in (n for n in names if n in ALONE):                     # timings: nothing else runs
        step(name)
    shutil.rmtree(work, ignore_errors=True)
    failed = [e["name"] for e in report["steps"] if not e["ok"]]
    if report["install"] is not None and not report["install"]["ok"]:
        failed.insert(0, "install")
    print(f"gpu-check on {args.device}: {'failed: ' + ', '.join(failed) if failed else 'every step ok'}; "
          f"{report['seconds']} s; report in {args.out / 'report.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
