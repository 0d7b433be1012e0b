"""Instructions the small fleet's judging takes (valgrind), against a base commit's in the same run.

The small fleet's replay (``bench_replay``'s long form at 29 nodes x 1 GPU, 32 devices) takes its judging's time,
and a change to the judging is worth a percent or two of it. This machine's speed moves 5% between runs of the
same code within an hour, so wall time can't tell such a change from the noise; the instructions it runs can
(valgrind's count moves about 0.5% between runs of the same code). Each tree (the base commit's ``otel_dra/`` and
this checkout's) replays the small fleet's first ``--lines`` lines in one process under ``valgrind
--tool=callgrind``, once as it is and once with the classifier's ingest and evaluation stubbed out: the
difference is the judging's instructions (ingest and evaluation, what the replay's own process spends beside
decoding). Each tree's bytecode is compiled first (a tree run uncompiled would count its compiling: this
environment sets ``PYTHONDONTWRITEBYTECODE``), hashing is fixed (``PYTHONHASHSEED=0``) and address
randomisation off (``setarch -R``). Instructions are not time (a cache miss costs more than an add), but a change
that removes work shows here first.

Run ``.venv/bin/python bench/bench_judge_instructions.py [--base REF] [--lines 3000] [--runs 2] [--workdir DIR]``
(valgrind: ``apt-get install valgrind``). A judging run takes ~50 s, a stubbed one ~35 s: ~6 minutes at the
defaults. The figures go to the terminal and to ``BENCHMARKS.md`` (the section between the
``bench_judge_instructions`` markers).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import _report  # noqa: E402
from bench.bench_replay import SMALL_FLEET, code_label, log, machine, recording_for  # noqa: E402

START, END = "<!-- bench_judge_instructions:start -->", "<!-- bench_judge_instructions:end -->"
#: What each valgrind run executes: the replay in one process, its classifier's work stubbed out or not.
CHILD = """
import io, sys
from pathlib import Path
from otel_dra import policy, replay
from otel_dra.classifier import classifier
if sys.argv[2] == "stub":
    classifier.Classifier.evaluate = lambda self, now_unix_nano=None: []
    classifier.Classifier.ingest_batch = lambda self, batch: None
result = replay.replay([Path(sys.argv[1])], policy.load(), io.StringIO(), decode_process=False)
print(result.evaluations)
"""
_COLLECTED = re.compile(r"Collected : (\d+)")


def head_of(recording: Path, lines: int, workdir: Path) -> Path:
    """The recording's first ``lines`` lines, as a gzip file beside it (reused when there)."""
    out = workdir / recording.name.replace(".jsonl.gz", f".head{lines}.jsonl.gz")
    if not out.exists():
        partial = out.with_suffix(".partial")
        with gzip.open(recording, "rb") as src, gzip.open(partial, "wb", compresslevel=1) as dst:
            for n, line in enumerate(src):
                if n >= lines:
                    break
                dst.write(line)
        partial.rename(out)
    return out


def base_tree(ref: str, into: Path) -> Path:
    """``otel_dra/`` as commit ``ref`` has it, unpacked under ``into`` (``git archive``: no worktree left behind)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "otel_dra"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"bench_judge_instructions: git archive {ref}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def instructions(tree: Path, recording: Path, mode: str) -> tuple[int, int]:
    """(instructions, evaluations) of one replay of ``recording`` on ``tree``'s ``otel_dra``, ``mode`` "judge" or
    "stub" (the classifier's work stubbed out)."""
    valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    fixed = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}
    cmd = [*fixed, *valgrind, sys.executable, "-c", CHILD, str(recording), mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree, check=False)
    found = _COLLECTED.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind ({mode}, {tree}): exit code {proc.returncode}\n{proc.stderr[-2000:]}")
    return int(found.group(1)), int(proc.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with (default: HEAD~1)")
    parser.add_argument("--lines", type=int, default=3000, help="the small fleet's first lines replayed (3000)")
    parser.add_argument("--runs", type=int, default=2, help="valgrind runs per tree and mode, the median counts (2)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep and reuse the recording here")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("bench_judge_instructions: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        recording = head_of(recording_for("long", 1, workdir, **SMALL_FLEET)[0], args.lines, workdir)
        trees = {"base": base_tree(args.base, Path(tmp) / "base"), "this": ROOT}
        for tree in trees.values():  # (compiled once each: every run then imports bytecode)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "otel_dra")], check=True)
        counts: dict[tuple[str, str], list[int]] = {(t, m): [] for t in trees for m in ("judge", "stub")}
        evaluations = 0
        for r in range(args.runs):
            for name in trees if r % 2 == 0 else list(trees)[::-1]:
                for mode in ("judge", "stub"):
                    got, evaluations = instructions(trees[name], recording, mode)
                    counts[(name, mode)].append(got)
                    log(f"run {r + 1}/{args.runs}: {name} {mode}: {got / 1e9:.4f} G instructions")
    judging = {t: statistics.median(counts[(t, "judge")]) - statistics.median(counts[(t, "stub")]) for t in trees}
    spread = {t: max(counts[(t, "judge")]) - min(counts[(t, "judge")]) for t in trees}
    ratio = judging["this"] / judging["base"]
    base_label = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True, text=True, check=False
    ).stdout.strip()
    rows = [
        f"| base: commit `{base_label or args.base}` | {judging['base'] / 1e9:.4f} G | "
        f"{judging['base'] / evaluations / 1e6:.2f} M | {spread['base'] / 1e6:.0f} M | — |",
        f"| this: {code_label()} | {judging['this'] / 1e9:.4f} G | {judging['this'] / evaluations / 1e6:.2f} M | "
        f"{spread['this'] / 1e6:.0f} M | x{ratio:.3f} ({100 * (ratio - 1):+.1f}%) |",
    ]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join(
        [
            START,
            "## The small fleet's judging in instructions (`bench/bench_judge_instructions.py`)",
            "",
            f"Measured {now} on {machine()}, valgrind's callgrind. The small fleet's recording (`bench_replay`'s, "
            f"{SMALL_FLEET['nodes']} nodes x {SMALL_FLEET['devices_per_node']} GPU), its first {args.lines:,} lines: "
            f"{evaluations:,} evaluations, replayed in one process. The judging: a replay's instructions less the "
            f"same replay's with the classifier's ingest and evaluation stubbed out; the median of {args.runs} runs "
            "of each, alternating trees.",
            "",
            "| tree | judging | per evaluation | spread of its runs | vs base |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "- Instructions, not time: wall time on this machine moves about 5% between runs of the same code, "
            "valgrind's count about 0.5%, so a change of a percent or two to the judging shows here and not in "
            "`bench_replay`'s times. The replay's wall time is `bench_replay`'s.",
            "",
            f"Reproduce: `.venv/bin/python bench/bench_judge_instructions.py --base {args.base}`.",
            END,
            "",
        ]
    )
    print(section)
    if not args.no_write:
        _report.write_section(START, END, section)
        log("wrote BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
