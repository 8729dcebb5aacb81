"""Run the benchmarks: ``python -m benchmarks [NAME ...] [--quick]``."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time

import jax

BENCHMARKS = [
    "function",
    "backward",
    "network",
    "train",
    "check",
    "layers",
    "scale",
    "memory",
    "models",
    "steps_per_call",
    "cpu_flags",
    "onnx_export",
    "matmul_precision",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds (smoke run)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}")
    print(
        f"difffn benchmarks | jax {jax.__version__} | {jax.devices()[0].platform} x"
        f"{len(jax.devices())} | {platform.processor() or platform.machine()} | "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    for name in args.names or BENCHMARKS:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"\n=== {name}: {module.__doc__.strip().splitlines()[0]}")
        module.run(quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
