"""The ``difffn`` command line.

``difffn --version`` prints difffn's version, with JAX's and Python's.

``difffn demo [--small]`` runs the main example (the custom ELU layer checked and trained on the
bundled digits, ``examples/00_elu_digits.py``), as ``make demo`` does.

``difffn check MODULE:FACTORY --layout "128,24,24,20:BSSC" [--layout ...] [--export] [--seed N]``
imports ``MODULE`` (from the current directory too, as ``python -m`` would), gets ``FACTORY`` (a
layer, or a callable returning one), runs [`df.check_layer`][difffn.check_layer] and prints the
report. Exit
status: 0 when every test passed or was skipped, 1 when one failed or was left incomplete, 2 for a
usage error.

Each subcommand is a ``_add_<name>(subparsers)`` function that registers its parser and handler.
"""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command-line argument that cannot be used; printed without a traceback."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``difffn`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"difffn {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="difffn",
        description="MATLAB-style custom layers on JAX: tools for the command line.",
    )
    parser.add_argument("--version", action="version", version=_version_line())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_check(subparsers)
    _add_demo(subparsers)
    return parser


def _version_line() -> str:
    """``difffn X.Y.Z (jax A.B.C, Python D.E.F)``: what ``difffn --version`` prints."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from ._core import __version__

    try:
        jax_version = version("jax")
    except PackageNotFoundError:  # pragma: no cover - jax is a dependency
        jax_version = "not installed"
    return f"difffn {__version__} (jax {jax_version}, Python {platform.python_version()})"


# -- difffn check ---------------------------------------------------------------------------------


def _add_check(subparsers) -> None:
    check = subparsers.add_parser(
        "check",
        help="check a custom layer (MATLAB's checkLayer)",
        description=(
            "Check a custom layer like MATLAB's checkLayer: method signatures, predict/forward, "
            "dtypes, multiple observations, state, initialize, backward, and gradients against "
            "numerical derivatives. Exit status 1 when a test fails or is incomplete."
        ),
    )
    check.add_argument(
        "target",
        metavar="MODULE:FACTORY",
        help="where the layer comes from, e.g. my_layers:make_srelu (a layer or a callable "
        "that returns one)",
    )
    check.add_argument(
        "--layout",
        action="append",
        required=True,
        type=parse_layout,
        metavar="SIZES:FMT",
        help='one per layer input, e.g. "128,24,24,20:BSSC"; use ? (or None) for an unknown size',
    )
    check.add_argument(
        "--export", action="store_true", help="also check that predict exports with jax.export"
    )
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.set_defaults(handler=_run_check)


def parse_layout(text: str):
    """``"128,24,24,20:BSSC"`` -> ``df.Layout((128, 24, 24, 20), "BSSC")``."""
    from ._core import FormatError, Layout

    sizes_text, sep, fmt = text.rpartition(":")
    if not sep or not sizes_text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not SIZES:FMT; expected e.g. '128,24,24,20:BSSC' (? for an unknown size)"
        )
    sizes = []
    for part in sizes_text.split(","):
        part = part.strip()
        if part in ("?", "None", "none", "_"):
            sizes.append(None)
        elif part.isdigit():
            sizes.append(int(part))
        else:
            raise argparse.ArgumentTypeError(
                f"size {part!r} in {text!r} is not a non-negative integer or ?"
            )
    try:
        return Layout(tuple(sizes), fmt.strip())
    except FormatError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def load_object(target: str):
    """Import ``"package.module:attribute"`` (the attribute may be dotted)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"{target!r} is not MODULE:FACTORY, e.g. my_layers:make_srelu")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the current directory
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import module {module_name!r}: {error}") from None
    for name in attribute.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}") from None
    return obj


def _run_check(args) -> int:
    from ._checking import check_layer, describe_exception
    from ._core import CheckError
    from ._layer import Layer

    obj = load_object(args.target)
    if not isinstance(obj, Layer):
        if not callable(obj):
            raise UsageError(f"{args.target} is a {type(obj).__name__}, not a layer or factory")
        try:
            obj = obj()
        except Exception as error:  # noqa: BLE001 - the factory is user code; say what it raised
            raise UsageError(
                f"calling {args.target}() raised {describe_exception(error)}\nFix: FACTORY must "
                "be a layer, or a function that takes no arguments and returns one."
            ) from None
    if not isinstance(obj, Layer):
        raise UsageError(f"{args.target}() returned a {type(obj).__name__}; expected a df.Layer")
    try:
        report = check_layer(obj, *args.layout, check_export=args.export, key=args.seed)
    except CheckError as error:
        raise UsageError(str(error)) from None
    print(report)
    return EXIT_OK if report.ok else EXIT_FAILED


# -- difffn demo ----------------------------------------------------------------------------------

DEMO = "00_elu_digits.py"


def _add_demo(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="check and train a custom ELU layer on the bundled digits",
        description=(
            "The main example: a custom ELU layer with a hand-written backward, checked with "
            "check_layer, trained with trainnet (default SGDM) on scikit-learn's bundled digits; "
            "prints the check report, the progress table, the test accuracy and the plot's path."
        ),
    )
    demo.add_argument("--small", action="store_true", help="tiny settings (a few seconds)")
    demo.set_defaults(handler=_run_demo)


def demo_script() -> Path:
    """The demo script: shipped in the package, or in the source checkout's examples/."""
    package = Path(__file__).resolve().parent
    for folder in (package / "examples", package.parent / "examples"):
        if (folder / DEMO).is_file():
            return folder / DEMO
    raise UsageError(
        f"the demo script {DEMO} was found neither in {package / 'examples'} nor in "
        f"{package.parent / 'examples'}. Fix: reinstall difffn, or run it from a source checkout."
    )


def _run_demo(args) -> int:
    script = demo_script()
    argv = sys.argv
    sys.argv = [str(script), *(["--small"] if args.small else [])]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
