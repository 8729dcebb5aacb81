"""Every error of an imported network is a ``df.Error`` naming the node: the internal
``Unsupported`` signal never escapes (a walk over every place that raises it), and an imported
network run at sizes that the file fixes says which node, which sizes moved, and the fix."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import difffn as df
from difffn._onnx import _ops

ONNX_DIR = Path(df.__file__).parent / "_onnx"
# Where code outside difffn/_onnx enters it: the public functions and the imported layers'
# methods that a network calls.
ENTRIES = {
    "import_onnx", "import_model", "export_onnx", "NodeFunction.__call__",
    "ONNXOperator.predict", "ONNXEntry.predict",
}  # fmt: skip
# Attribute calls that run an operator's registered function, check or label rule.
OPERATOR_CALLS = {"fn", "check", "labels"}


def _catches(handler: ast.ExceptHandler) -> bool:
    names = (
        {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)} if handler.type else set()
    )
    reraises = (
        len(handler.body) == 1
        and isinstance(handler.body[0], ast.Raise)
        and handler.body[0].exc is None
    )
    return bool(names & {"Unsupported", "Exception"}) and not reraises


class _Function:
    def __init__(self, qualname, node):
        self.qualname, self.name = qualname, qualname.rpartition(".")[2]
        self.raises: list[int] = []  # lines of unguarded raise Unsupported
        self.calls: set[tuple[str, str]] = set()  # unguarded calls: (kind, name)
        self.method = "." in qualname
        self.operator = any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") in ("op", "fused")
            for d in node.decorator_list
        )
        self._walk(node.body, guarded=False)

    def _walk(self, body, guarded):
        for stmt in body:
            self._visit(stmt, guarded)

    def _visit(self, node, guarded):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            and node is not None
        ):
            if not isinstance(node, ast.Lambda):
                return  # nested functions are walked on their own
        if isinstance(node, ast.Try):
            inner = guarded or any(_catches(h) for h in node.handlers)
            self._walk(node.body, inner)
            for part in (node.handlers, node.orelse, node.finalbody):
                for stmt in part:
                    self._visit(stmt, guarded)
            return
        if isinstance(node, ast.Raise) and node.exc is not None and not guarded:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if getattr(exc, "id", "") == "Unsupported":
                self.raises.append(node.lineno)
        if isinstance(node, ast.Call) and not guarded:
            func = node.func
            if isinstance(func, ast.Name):
                self.calls.add(("function", func.id))
            elif isinstance(func, ast.Attribute):
                on_self = isinstance(func.value, ast.Name) and func.value.id in ("self", "cls")
                module = isinstance(func.value, ast.Name) and func.value.id.startswith("_")
                kind = "method" if on_self else "function" if module else "attribute"
                self.calls.add((kind, func.attr))
        for child in ast.iter_child_nodes(node):
            self._visit(child, guarded)


def _functions():
    found = []
    for path in sorted(ONNX_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())

        def collect(node, prefix, path=path):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    collect(child, f"{prefix}{child.name}.", path)
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((path.name, _Function(prefix + child.name, child)))
                    collect(child, f"{prefix}{child.name}.", path)

        collect(tree, "")
    return found


def _callees(fn, functions):
    """What a call may reach: ``f(...)`` and ``_module.f(...)`` module functions,
    ``self.f(...)`` the methods of that name (the importer is one class of mixins), and
    ``obj.f(...)`` any method of that name."""
    cls = fn.qualname.rpartition(".")[0]
    for kind, name in fn.calls:
        named = [g for _, g in functions if g.name == name and g.method == (kind != "function")]
        own = [g for g in named if g.qualname == f"{cls}.{name}"]
        yield from own if kind == "method" and own else named


def test_unsupported_is_internal_and_never_escapes_an_entry():
    assert not issubclass(_ops.Unsupported, df.Error)  # so it must be converted
    functions = _functions()
    sites = [(f, fn.qualname, line) for f, fn in functions for line in fn.raises]
    assert len(sites) > 40  # every operator family raises it: the walk sees them
    escapes = {fn.qualname for _, fn in functions if fn.raises}
    operators_escape = any(fn.operator and fn.qualname in escapes for _, fn in functions)
    changed = True
    while changed:  # callers of an escaping function escape unless the call is guarded
        changed = False
        for _, fn in functions:
            if fn.qualname in escapes:
                continue
            if any(g.qualname in escapes for g in _callees(fn, functions)) or (
                operators_escape
                and any(k == "attribute" and n in OPERATOR_CALLS for k, n in fn.calls)
            ):
                escapes.add(fn.qualname)
                changed = True
    leaking = sorted(ENTRIES & escapes)
    assert not leaking, f"Unsupported reaches {leaking} unconverted"
    assert ENTRIES <= {fn.qualname for _, fn in functions}  # the entries exist


def _fixed_reshape_model():
    """x (2, 4, 3) -> Reshape to the constant [4, 6]: the file fixes the batch at 2."""
    shape = numpy_helper.from_array(np.array([4, 6], np.int64), "target")
    node = helper.make_node("Reshape", ["x", "target"], ["y"], name="/fixed/Reshape")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])], [shape],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_size_the_file_fixes_is_a_named_error_at_predict():
    net = df.import_onnx(_fixed_reshape_model(), input_formats={"x": "BUU"})
    x = np.ones((2, 4, 3), np.float32)
    assert np.asarray(df.stripdims(net.predict(x))).shape == (4, 6)
    with pytest.raises(df.ONNXImportError, match=r"(?s)Reshape node '/fixed/Reshape'.*"
                       r"\(3, 4, 3\).*input 0 axis 0: 2 at import, 3 now.*'x' axis 0 \(batch\)"
                       r".*Fix: call the network with the sizes"):  # fmt: skip
        net.predict(np.ones((3, 4, 3), np.float32))
