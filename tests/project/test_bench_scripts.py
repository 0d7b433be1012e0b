"""Every benchmark runs as BENCHMARKS.md says, ``.venv/bin/python bench/<name>.py``: Python puts the script's own
folder on the path then, not the repository, so a bench must put the repository there before it imports
``bench``'s helpers (bench_sources once did it after, and stopped at its first line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "bench").glob("bench_*.py"))

# Each script is loaded as ``python bench/<name>.py`` would load it (its folder first on the path, the working
# directory elsewhere), but under another name than __main__: its imports run, its benchmark does not. One process
# for all of them, each from the path it starts with and without the ``bench`` package another one imported.
LOAD = """
import runpy, sys
sys.path[0] = sys.argv[1]
start = list(sys.path)
for path in sys.argv[2:]:
    sys.path[:] = start
    for name in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
        del sys.modules[name]
    runpy.run_path(path, run_name="bench_import_check")
    print("loaded", path)
"""


def test_every_bench_script_loads_as_it_is_run(tmp_path: Path):
    assert len(BENCHES) >= 10, BENCHES
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(ROOT / "bench"), *map(str, BENCHES)],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # (as a user runs it: no PYTHONPATH to lean on)
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("loaded ") == len(BENCHES)
