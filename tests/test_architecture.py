"""The package layout: files written before the floors became packages still load and resume."""

import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_tree_allclose

import difffn as df

BEFORE = Path(__file__).parent / "data" / "before_move"
sys.path.insert(0, str(BEFORE))
import make  # noqa: E402  (the script that wrote the files: the same network, data and options)


def test_a_network_saved_before_the_move_loads():
    net = make.network()
    loaded = df.load(BEFORE / "network.difffn", like=net)
    assert_tree_allclose(loaded.learnables, net.learnables, rtol=0, atol=0)
    x = jnp.ones((2, 4))
    np.testing.assert_array_equal(loaded.predict(x).data, net.predict(x).data)


def test_an_export_written_before_the_move_runs():
    exported = df.load_exported(BEFORE / "network.export.difffn")
    x = jnp.linspace(-1, 1, 12).reshape(3, 4)
    np.testing.assert_allclose(
        np.asarray(exported.predict(x).data),
        np.asarray(make.network().predict(x).data),
        rtol=1e-6,
        atol=1e-6,
    )


def test_a_checkpoint_written_before_the_move_resumes_exactly(tmp_path):
    """The fingerprint names the loss by the module path it had then (difffn._scoring._losses).

    A fingerprint that differed would refuse the resume with a SerializationError.
    """
    folder = tmp_path / "checkpoints"
    shutil.copytree(BEFORE / "checkpoints", folder)
    first = next(folder.glob("net_checkpoint__3__*.difffn"))
    X, T = make.data()
    options = df.TrainingOptions(
        "sgdm",
        max_epochs=2,
        mini_batch_size=8,
        shuffle="never",
        verbose=False,
        checkpoint_path=folder,
        checkpoint_frequency=1,
    )
    net = make.network()
    resumed, _ = df.trainnet(
        X, T, net, df.losses.crossentropy, options, key=jax.random.key(1), resume_from=first
    )
    fresh, _ = df.trainnet(
        X,
        T,
        net,
        df.losses.crossentropy,
        options.replace(checkpoint_path=None),
        key=jax.random.key(1),
    )
    # Bit-exact in a plain process (the one that wrote the files); the suite compiles with fewer
    # of LLVM's passes (tests/conftest.py), which may change the last digits, so they are not
    # compared.
    assert_tree_allclose(resumed.learnables, fresh.learnables, rtol=1e-5, atol=1e-7)


# -- the floors --------------------------------------------------------------------------------

# Bottom to top. A package may import from the packages before it, only through their
# __init__ (the package's internal API, its __all__ for the private ones), never a module inside.
FLOORS = (
    "data",
    "_core",
    "_scoring",
    "_function",
    "ops",
    "_layer",
    "layers",
    "_network",
    "interop",
    "_onnx",
    "_persistence",
    "_devices",
    "_batching",
    "_training",
    "_checking",
)
# The one sanctioned reach into another package's modules: a built-in layer and its functional
# op are one computation, and the layers use the op kernels that df.ops's public namespace does
# not list (ops._recurrent's scans, ops._attention's head splitting, ops._format_args).
FRIENDS = {("layers", "ops")}
PACKAGE_ROOT = Path(df.__file__).parent


def _imports():
    """(module file, line, importing package, target module, imported names) for every import."""
    import ast

    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT)
        module = ["difffn", *rel.with_suffix("").parts]
        if module[-1] == "__init__":
            module = module[:-1]
            package_parts = module
        else:
            package_parts = module[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "difffn":
                        yield rel, node.lineno, module, alias.name.split("."), None
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package_parts[: len(package_parts) - node.level + 1]
                    target = base + (node.module.split(".") if node.module else [])
                elif node.module and node.module.split(".")[0] == "difffn":
                    target = node.module.split(".")
                else:
                    continue
                yield rel, node.lineno, module, target, [a.name for a in node.names]


def _package(parts):
    """The floor package a module belongs to (None for difffn's top modules)."""
    if len(parts) >= 2 and (PACKAGE_ROOT / parts[1]).is_dir():
        return parts[1]
    return None


def test_every_package_is_a_floor():
    packages = sorted(p.name for p in PACKAGE_ROOT.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(FLOORS)
    loose = sorted(p.name for p in PACKAGE_ROOT.glob("_*.py") if p.name != "__init__.py")
    assert loose == ["__main__.py", "_cli.py"], "a private module outside the floors"


def test_packages_import_only_downward_and_only_through_their_init():
    import importlib

    wrong = []
    for rel, line, module, target, names in _imports():
        mine = _package(module)
        if len(target) == 1:  # from difffn import ...: packages of the top
            targets = [(["difffn", n], None) for n in names or []]
        else:
            targets = [(target, names)]
        for t, imported in targets:
            theirs = _package(t)
            if theirs is None or theirs == mine:
                continue
            where = f"{rel}:{line} imports {'.'.join(t)}"
            if mine is not None and FLOORS.index(theirs) >= FLOORS.index(mine):
                wrong.append(f"{where}: upward ({mine} is below {theirs})")
            if len(t) > 2 and (mine, theirs) not in FRIENDS:
                wrong.append(f"{where}: a module inside {theirs}, not its __init__")
            if len(t) == 2 and imported and theirs.startswith("_"):
                api = importlib.import_module(f"difffn.{theirs}").__all__
                for name in imported:
                    if name not in api:
                        wrong.append(f"{where}: {name!r} is not in difffn.{theirs}.__all__")
    assert not wrong, "\n".join(wrong)


def test_each_private_package_exports_what_it_lists():
    import importlib

    for floor in FLOORS:
        if floor.startswith("_"):
            package = importlib.import_module(f"difffn.{floor}")
            assert package.__doc__, floor
            missing = [n for n in package.__all__ if not hasattr(package, n)]
            assert not missing, (floor, missing)
