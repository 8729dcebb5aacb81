"""difffn's own JAX primitive for a ``DifferentiableFunction``, used in two cases.

1. The class defines ``jvp``. ``jax.custom_vjp`` has no forward mode, and ``jax.custom_jvp``
   derives reverse mode by transposing the jvp rule, so neither can use the user's ``jvp`` in
   forward mode *and* the user's ``backward`` in reverse mode. JAX's ``VJPHiPrimitive`` (the
   machinery under the coming ``custom_vjp3``) has separate rules for both.
2. ``JAX_CUSTOM_VJP3=1``. Then ``jax.custom_vjp`` is itself a ``VJPHiPrimitive``, but with
   ``symbolic_zeros=True`` it cannot be linearized through ``jax.checkpoint`` yet. This primitive
   implements that path: the forward rule plus a linear op whose transpose is the user's backward,
   with the real ``compute_gradients`` flags.

``VJPHiPrimitive`` is internal to JAX; every other class uses the public ``jax.custom_vjp``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from . import _cotangents as ct
from ._errors import DifferentiableFunctionError, ForwardModeError
from ._function import make_residuals, run_backward, run_forward

try:
    from jax._src import ad_util
    from jax._src.hijax import VJPHiPrimitive, fake_linear_op
    from jax._src.interpreters import batching
except ImportError as error:  # pragma: no cover - depends on the JAX version
    _IMPORT_ERROR: ImportError | None = error
    VJPHiPrimitive = object  # type: ignore[assignment,misc]
else:
    _IMPORT_ERROR = None


def primitive_implementation(fcn):
    """A callable for ``fcn`` built on difffn's primitive (forward mode via ``fcn.jvp`` if any)."""
    if _IMPORT_ERROR is not None:  # pragma: no cover
        raise ForwardModeError(
            f"{type(fcn).__name__} defines jvp, but this JAX version ({jax.__version__}) lacks "
            "the primitive API difffn uses to combine jvp with a custom backward. Fix: install "
            "jax>=0.10.2, or remove jvp to use reverse mode only."
        ) from _IMPORT_ERROR

    def call(*xs):
        return _primitive(fcn, tuple(jax.typeof(x) for x in xs))(*xs)

    return call


@functools.lru_cache(maxsize=512)
def _primitive(fcn, in_avals):
    return _JVPFunctionPrimitive(fcn, in_avals)


class _JVPFunctionPrimitive(VJPHiPrimitive):  # type: ignore[misc,valid-type]
    def __init__(self, fcn, in_avals):
        self.in_avals = tuple(in_avals)
        self._traced = jax.jit(lambda *xs: run_forward(fcn, xs)[0]).trace(*in_avals)
        self.out_aval = tuple(self._traced.out_avals)
        self.params = dict(fcn=fcn, avals=self.in_avals)
        super().__init__()

    def expand(self, *xs):
        return run_forward(self.fcn, xs)[0]

    def vjp_fwd(self, nzs_in, *xs):
        compute_gradients = tuple(bool(nz) for nz in nzs_in)
        outputs, memory = run_forward(self.fcn, xs)
        return outputs, make_residuals(self.fcn, xs, outputs, memory, compute_gradients)

    def vjp_bwd_retval(self, residuals, output_cotangents):
        grads = run_backward(self.fcn, residuals, tuple(output_cotangents))
        return tuple(
            ad_util.Zero(aval.to_ct_aval()) if g is None else g
            for g, aval in zip(grads, self.in_avals)
        )

    def jvp(self, primals, tangents):
        if not callable(getattr(self.fcn, "jvp", None)):
            return self._linearized_jvp(primals, tangents)
        return self._user_jvp(primals, tangents)

    def _linearized_jvp(self, primals, tangents):
        # Reverse mode through jax.checkpoint arrives here: the tangent map is a linear op whose
        # transpose is the user's backward. Evaluating it (true forward mode) is JAX's error.
        nonzero = [not ct.is_symbolic_zero(t) for t in tangents]
        outputs, residuals = self.vjp_fwd(tuple(nonzero), *primals)
        out_tangents = fake_linear_op(self, nonzero, residuals, *tangents)
        return outputs, jax.tree.unflatten(self.out_tree, out_tangents)

    def _user_jvp(self, primals, tangents):
        cls = type(self.fcn)
        specs = [ct.Spec.of(x) for x in primals]
        tangents = tuple(
            None if not spec.differentiable else ct.instantiate(t, spec)
            for t, spec in zip(tangents, specs)
        )
        result = self.fcn.jvp(tuple(primals), tangents)
        who = f"{cls.__name__}.jvp"
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise DifferentiableFunctionError(
                f"{who} returned {type(result).__name__}; expected a pair (outputs, "
                "output_tangents), like a jax.custom_jvp rule."
            )
        outputs, out_tangents = result
        n_out = cls.num_outputs
        if n_out == 1:
            outputs, out_tangents = (outputs,), (out_tangents,)
        names = [f"output{i + 1}" for i in range(n_out)]
        outputs = ct.normalize_returns(outputs, n_out, who=who, names=names)
        out_tangents = ct.normalize_returns(out_tangents, n_out, who=who, names=names)
        out_specs = [ct.Spec(tuple(a.shape), a.dtype, ct.varying_axes(a)) for a in self.out_aval]
        checked = []
        for i, (t, spec) in enumerate(zip(out_tangents, out_specs)):
            if t is None:
                t = jnp.zeros(spec.shape, spec.dtype)
            checked.append(
                ct.check_gradient(
                    t, spec, who=who, what=f"the tangent of output {i + 1}", required=True
                )
            )
        return tuple(jnp.asarray(y) for y in outputs), tuple(checked)

    def batch_dim_rule(self, axis_data, in_dims):
        in_dims_flat = self.in_tree.flatten_up_to(in_dims)
        _, out_dims = batching.batch_jaxpr2(self._traced.jaxpr, axis_data, tuple(in_dims_flat))
        return jax.tree.unflatten(self.out_tree, out_dims)
