"""Install size and time: the core (`pip install kcl_pipeline`) against the full runtime install
(`kcl_pipeline[dagster,postgres,spark,local]`), each into a fresh venv from the same wheel in the same run.

    python benchmarks/bench_install.py [--python python3.11] [--repeat 1]

Packages come from the machine's package index and pip's cache (as they would on a CI runner with a warm
cache); the ratio is what the core saves a consumer host. Prints one line per install and the ratios.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULL = "dagster,postgres,spark,local"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def build_wheel(out: Path) -> Path:
    src = out / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        "node_modules", ".venv*", ".git", "__pycache__", ".kcl_local", "*.egg-info", "build", "dist"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(src)], check=True, env=ENV)
    return next(out.glob("kcl_pipeline-*.whl"))


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def install(python: str, wheel: Path, extras: str | None, where: Path) -> tuple[float, int, int]:
    subprocess.run([python, "-m", "venv", str(where)], check=True, env=ENV)
    baseline = du(where)
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    started = time.perf_counter()
    subprocess.run([str(where / "bin" / "pip"), "install", "-q", target], check=True, env=ENV,
                   stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    count = len(subprocess.run([str(where / "bin" / "pip"), "list", "--format", "freeze"], check=True, env=ENV,
                               capture_output=True, text=True).stdout.split())
    return seconds, du(where) - baseline, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        results: dict[str, list[tuple[float, int, int]]] = {"core": [], "full": []}
        for i in range(args.repeat):
            for name, extras in (("core", None), ("full", FULL)):
                where = Path(tmp) / f"{name}-{i}"
                results[name].append(install(args.python, wheel, extras, where))
                shutil.rmtree(where)
        for name, runs in results.items():
            best = min(runs)
            print(f"{name:<5} install {best[0]:6.1f} s   size {best[1] / 2**20:7.1f} MiB   packages {best[2]}")
        core, full = min(results["core"]), min(results["full"])
        print(f"core / full: time {core[0] / full[0]:.2f}x, size {core[1] / full[1]:.3f}x "
              f"({full[1] / core[1]:.1f}x smaller), packages {core[2]}/{full[2]}")


if __name__ == "__main__":
    main()
