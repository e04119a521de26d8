"""Run the benchmark suite and print one table per section (markdown).

    python benchmarks/run.py [--quick] [--only mixer,decoding,generation] [--device cuda] [--out FILE]

Sections run in a fixed order whatever the order given to ``--only``.

Every figure is a ratio against a baseline measured in the same run, from medians of
repeated runs; ``--out`` also writes the tables, with the machine they ran on, to FILE.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import sys
from pathlib import Path

import torch

from implicitlm.core.atomic_io import atomic_write

# The section modules of this folder, each imported only when it runs: multiple_choice needs
# lm-eval, which a GPU machine set up for the GPU check (scripts/gpu-check.sh) lacks.
# training_step last: torch.compile leaves its compiler threads and caches in the process,
# which slows the eager sections measured after it.
SECTIONS = ["mixer", "decoding", "generation", "chunked", "scoring", "multiple_choice", "solvers",
            "data_generation", "precision", "training_step"]


def machine(device: str) -> str:
    accelerator = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    return (
        f"{datetime.date.today().isoformat()}; {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"{torch.get_num_threads()} torch threads, {accelerator}; torch {torch.__version__}, "
        f"Python {platform.python_version()}"
    )


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (about 5 minutes on 2 CPU cores)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    requested = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = sorted(requested - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    args.sections = [name for name in SECTIONS if name in requested]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    header = f"Machine: {machine(args.device)}\n"
    print(header, flush=True)
    tables = []
    for name in args.sections:
        table = importlib.import_module(name).run(args.quick, args.device).markdown()
        print(table, flush=True)
        tables.append(table)
    if args.out:
        text = "\n".join([header, *tables])
        atomic_write(args.out, lambda temporary: temporary.write_text(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
