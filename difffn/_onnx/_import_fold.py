"""Constant folding and programs: nodes computed from constants and tensor shapes.

A node whose inputs are all constants is evaluated at import with difffn's own implementation
of the operator (``_fold``); one that also reads the shapes of runtime tensors (PyTorch's
``Shape -> Gather -> Concat -> Reshape``) becomes a step of a ``Program`` that is evaluated
while the network is traced, so the batch size may vary (``_defer``, ``program``); its value at
the import's stand-in sizes decides what needs deciding at import (``stand_in``). A mixin of
``Importer`` (``_import``): it reads and writes the importer's table of tensor kinds.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import _limits
from ._import_values import Const, Deferred, NodeInfo
from ._layers import Program, Step
from ._load import Node
from ._ops import Attrs, FrozenArray, registered, run


class Folding:
    """``Importer``'s constants and programs (uses ``values`` and ``steps``)."""

    values: dict[str, Any]  # the importer's table of tensor kinds
    steps: dict[str, Step]

    def _fold(self, node: Node, a: Attrs, info: NodeInfo) -> None:
        args = []
        for name, kind in zip(node.inputs, info.input_kinds):
            if kind == "const":
                args.append(self.values[name].value)
            elif kind == "runtime":
                value = self.values[name]
                args.append(jax.ShapeDtypeStruct(value.shape, value.dtype))
            elif kind == "program":
                args.append(self.stand_in(name))
            else:
                args.append(None)
        with jax.ensure_compile_time_eval():
            outputs = _limits.folding(node, a, args, lambda: run(node.op_type, a, args))
        for name, value in zip(node.outputs, outputs):
            if name:
                self.values[name] = Const(np.asarray(value))

    def _defer(self, node: Node, a: Attrs) -> None:
        step = Step(node.op_type, a, node.inputs, node.outputs)
        for name in node.outputs:
            if name:
                self.steps[name] = step
                self.values[name] = Deferred()

    def program(self, name: str) -> Program:
        """The program that computes the deferred tensor ``name``."""
        steps, constants, sources, seen = [], {}, [], set()

        def visit(tensor):
            step = self.steps[tensor]
            if id(step) in seen:
                return
            seen.add(id(step))
            meta = dict(registered(step.op_type).meta)
            for position, inp in enumerate(step.inputs):
                if not inp:
                    continue
                value = self.values[inp]
                if isinstance(value, Deferred):
                    visit(inp)
                elif isinstance(value, Const):
                    constants[inp] = FrozenArray(value.value)
                elif position in meta and inp not in sources:
                    sources.append(inp)
            steps.append(step)

        visit(name)
        return Program(tuple(steps), tuple(constants.items()), tuple(sources), name)

    def stand_in(self, name: str) -> np.ndarray:
        """A deferred tensor's value at the stand-in sizes (for decisions at import)."""
        cache = self.__dict__.setdefault("_stand_ins", {})
        if name not in cache:
            cache[name] = self._evaluate_stand_in(name)
        return cache[name]

    def _evaluate_stand_in(self, name: str) -> np.ndarray:
        """The producing step on its inputs' stand-in values (each deferred input's cached:
        one step per tensor, not the whole program again)."""
        step = self.steps[name]
        meta = dict(registered(step.op_type).meta)
        args = []
        for position, inp in enumerate(step.inputs):
            value = self.values.get(inp) if inp else None
            if value is None:
                args.append(None)
            elif isinstance(value, Deferred):
                args.append(self.stand_in(inp))
            elif isinstance(value, Const):
                args.append(value.value)
            elif position in meta:  # a runtime tensor read for its shape or dtype
                args.append(jax.ShapeDtypeStruct(value.shape, value.dtype))
            else:
                args.append(None)
        with jax.ensure_compile_time_eval():  # bounded, errors named by node (_limits)
            outputs = _limits.folding(
                step.attrs, step.attrs, args, lambda: run(step.op_type, step.attrs, args)
            )
        return np.asarray(outputs[step.outputs.index(name)])
