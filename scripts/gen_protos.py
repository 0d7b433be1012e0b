"""Regenerate the kubelet gRPC stubs (``otel_dra/sinks/kubelet/api/*_pb2*.py``) from the ``.proto`` files beside them.

The one command that writes them: ``.venv/bin/python scripts/gen_protos.py``. ``--out DIR`` writes the
tree under DIR instead (``tests/unit/sinks/test_kubelet_stream.py`` does that and compares, so the committed stubs
can't drift from the protos); ``--check`` does the comparison itself and exits 1 on any difference.

The repository root is the proto path, so each file's descriptor name is its repository path
(``otel_dra/sinks/kubelet/api/dra_health_v1.proto``: distinct, unlike upstream's three ``api.proto``) and the
generated ``_pb2_grpc`` modules import their messages as ``from otel_dra.sinks.kubelet.api import ...``, which
works from the installed package without touching ``sys.path``.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from importlib import resources
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
API_DIR = Path("otel_dra") / "sinks" / "kubelet" / "api"


def proto_files() -> list[Path]:
    """The ``.proto`` sources, as paths relative to the repository root (the proto path)."""
    return sorted(p.relative_to(REPO) for p in (REPO / API_DIR).glob("*.proto"))


def generated_files(root: Path) -> list[Path]:
    """The generated stubs under ``root``, relative to it."""
    return sorted(p.relative_to(root) for p in (root / API_DIR).glob("*_pb2*.py*") if p.suffix in (".py", ".pyi"))


def generate(out: Path) -> list[Path]:
    """Run protoc (grpcio-tools, in process) over every proto; the stubs land under ``out``/API_DIR."""
    from grpc_tools import protoc  # a test/dev dependency; only needed to regenerate

    out.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    protos = [str(REPO / p) for p in proto_files()]
    if not protos:
        raise SystemExit(f"no .proto files in {REPO / API_DIR}")
    argv = [
        "grpc_tools.protoc",
        f"--proto_path={REPO}",
        f"--proto_path={well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",  # type stubs: the generated messages are built at run time, so mypy needs these
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(argv) != 0:
        raise SystemExit("protoc failed (see its message above)")
    return generated_files(out)


def drift(root: Path = REPO) -> list[str]:
    """Differences between the stubs under ``root`` and freshly generated ones; empty when in sync."""
    with tempfile.TemporaryDirectory(prefix="gen-protos-") as tmp:
        fresh_root = Path(tmp)
        fresh = generate(fresh_root)
        committed = generated_files(root)
        problems = [f"missing: {p}" for p in fresh if p not in committed]
        problems += [f"stale (no proto generates it): {p}" for p in committed if p not in fresh]
        problems += [
            f"differs: {p}"
            for p in fresh
            if p in committed and not filecmp.cmp(fresh_root / p, root / p, shallow=False)
        ]
        return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO, help="root to write otel_dra/sinks/kubelet/api/ under")
    parser.add_argument("--check", action="store_true", help="compare the committed stubs instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        problems = drift()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("stubs are out of date: run .venv/bin/python scripts/gen_protos.py", file=sys.stderr)
        return 1 if problems else 0
    for path in generate(args.out.resolve()):
        print(args.out / path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
