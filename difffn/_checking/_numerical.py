r"""Numerical derivatives for the gradient checks: vectorized central differences in float64.

A gradient check asks whether the gradient ``g`` of the scalar loss
$L = \sum_j \langle \bar y_j, y_j \rangle$ (random upstream gradients $\bar y_j$)
with respect to each *segment* of a flat float64 vector (one layer input, one learnable...) agrees
with finite differences. ``g`` comes from the code under test: a custom backward, or JAX autodiff
when there is none. A second source, JAX autodiff of the forward computation, serves as a
reference where it exists.

**Probes.** A probe is a direction ``u`` inside one segment: a sparse random ±1 vector (a
*directional probe*, covering up to 8192 elements at once) or a single element (a *coordinate
probe*, which says *where*). Each element moves in proportion to its scale
$\tau_i = \max(|p_i|, \mathrm{rms}(\text{leaf}))$, so steps are relative. A probe is
evaluated at seven points $p + c\,\tau \odot u$, $c \in \{0, \pm s_1, \pm s_2,
\pm s_3\}$, in one ``jax.vmap``-batched call; several probes share a call, and one compiled
function serves the probes of every segment (a probe perturbs the whole flat vector, zero outside
its support). Which probes run: three directional probes per segment (all elements of a segment
of at most four), the elements where the code under test and autodiff disagree most, and, to
locate a failure without a trusted autodiff reference, coordinate probes (every element of a
segment of at most 32).

**Precision.** Loss changes are formed element by element,
$\Delta L = \sum_j \langle \bar y_j, y_j(p + c\,\tau u) - y_j(p) \rangle$, so outputs that
did not move contribute nothing. The rounding noise is estimated from the outputs that moved, as
a random walk: $16\,\epsilon\,(\sum (|\bar y|(|y| + |y_0|))^2)^{1/2}$ per unit step.

**Kinks.** At a point where the function is not differentiable (ReLU at 0, SReLU's thresholds)
finite differences are meaningless. A probe whose step crosses a kink gives central differences
that disagree across step sizes; a probe that sits on one gives one-sided differences whose gap
does not shrink with the step. Such a sample point is *moved* (the segment is jittered by about
$10^{-3}\tau$, the gradients recomputed there) and the probe re-evaluated, at most three
times; it is never reported as a failure, and one that stays unresolved is left out of the verdict.

**Verdict.** A resolved probe with central estimate $D$ (the smallest step that agrees with
the next larger one) and analytic directional derivative $a = \langle g, \tau \odot u
\rangle$ passes when $|D - a| \le 10^{-6} (R + R_f) + N$: $R = \sum_j |\bar y_j|\,
|\Delta y_j| / 2s$ is the absolute-sum scale of the loss change (it does not depend on the code
under test), $R_f$ is $10^{-3}$ of the segment's largest $R$, $N$ the
noise floor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

STEPS = (1e-6, 1e-7, 1e-8)
"""Step sizes relative to each element's scale, largest first."""
RTOL = 1e-6
"""Relative tolerance of a probe, against the absolute-sum scale of the loss change."""
NOISE_FACTOR = 16.0
FLOOR_FRACTION = 1e-3
MAX_MOVES = 3
MOVE_SIZE = 1e-3
NUM_DIRECTIONS = 3
DIRECTION_SUPPORT = 8192
"""Most elements one directional probe perturbs (fewer kinks crossed than a dense direction)."""
ALL_COORDINATES_UP_TO = 32
"""To locate a failure, segments of at most this many elements are probed element by element."""
ONLY_COORDINATES_UP_TO = 4
NUM_WORST = 4
NUM_LOCATE = 16
_DISAGREEMENT = 1e-8
_EVALS_PER_PROBE = 1 + 2 * len(STEPS)
_CHUNK_ELEMENTS = 1 << 21  # float64 elements one batched evaluation may hold, roughly
_MAX_CHUNK = 8
COORDINATE, DIRECTION = "coordinate", "direction"


class Model(Protocol):
    """What is differentiated: everything this module uses of it, and nothing more.

    Hashable (it is a static argument of the compiled evaluators). Calls go one way: this module
    calls the model; the model never calls back into this module.
    """

    @property
    def traceable(self) -> bool:
        """Whether ``outputs`` and ``gradients`` may be traced (``jax.jit``, ``jax.vmap``); if
        not, they run eagerly, one point at a time."""
        ...

    def outputs(self, args: Any, parts: tuple) -> list:
        """The outputs at the point ``parts`` (one flat float64 array per segment); ``args``:
        the fixed arrays (a pytree)."""
        ...

    def gradients(self, args: Any, parts: tuple) -> dict:
        """``{source: gradient, all segments concatenated}`` at ``parts``; ``"backward"`` (if
        any) is the source under test, else ``"autodiff"``. A second source serves as a
        reference."""
        ...


@dataclass(frozen=True)
class Segment:
    """A named slice of the flat vector: one value whose gradient is checked."""

    name: str
    start: int
    size: int

    @property
    def stop(self) -> int:
        return self.start + self.size


@dataclass
class ProbeResult:
    """The finite-difference verdict of one probe (at its last sample point)."""

    segment: str
    kind: str  # COORDINATE or DIRECTION
    index: int  # element within the segment, or direction number
    numerical: float = math.nan  # derivative along tau * u
    analytic: dict = field(default_factory=dict)  # source -> derivative along tau * u
    tolerance: float = math.nan
    scale: float = 1.0  # tau of the element (coordinate probes), to convert to gradient units
    resolved: bool = False
    reason: str = "not evaluated"
    moves: int = 0

    def error(self, source: str) -> float:
        return abs(self.numerical - self.analytic[source])

    def passes(self, source: str) -> bool:
        return bool(self.error(source) <= self.tolerance)  # NaN fails

    def relative_error(self, source: str) -> float:
        denominator = max(abs(self.numerical), abs(self.analytic[source]), 1e-300)
        return self.error(source) / denominator


@dataclass
class GradientVerdict:
    """What the finite differences say about one segment."""

    segment: Segment
    status: str  # "Passed", "Failed" or "Incomplete"
    under_test: str
    gradients: dict  # source -> the segment's gradient (numpy, flat) at the unmoved point
    probes: list
    moves: int

    @property
    def resolved(self) -> list:
        return [p for p in self.probes if p.resolved]

    @property
    def unresolved(self) -> list:
        return [p for p in self.probes if not p.resolved]

    def failing(self, source: str | None = None) -> list:
        source = source or self.under_test
        return [p for p in self.resolved if not p.passes(source)]

    @property
    def reference_ok(self) -> bool:
        """Whether autodiff (a second source) agreed with every resolved probe."""
        if "autodiff" not in self.gradients or self.under_test == "autodiff":
            return False
        return bool(self.resolved) and all(p.passes("autodiff") for p in self.resolved)

    def reference(self) -> np.ndarray | None:
        """A trusted full gradient: validated autodiff, or every element probed and resolved."""
        if self.reference_ok:
            return self.gradients["autodiff"]
        coords = {p.index: p for p in self.resolved if p.kind == COORDINATE}
        if len(coords) == self.segment.size:
            return np.array([coords[i].numerical / coords[i].scale for i in range(len(coords))])
        if self.status == "Passed":
            return self.gradients[self.under_test]
        return None


def element_scale(leaves: Sequence) -> np.ndarray:
    r"""The flat per-element scale $\tau_i = \max(|p_i|, \mathrm{rms}(\text{leaf}))$.

    Computed on the host (NumPy, float64). A leaf of zeros gets scale 1, so a step never vanishes.
    """
    parts = []
    for leaf in leaves:
        flat = np.ravel(np.asarray(leaf, np.float64))
        rms = float(np.sqrt(np.mean(flat**2))) if flat.size else 1.0
        parts.append(np.maximum(np.abs(flat), rms if rms > 0 else 1.0))
    return np.concatenate(parts) if parts else np.zeros((0,), np.float64)


def split(flat, segments: Sequence[Segment]) -> tuple:
    """The per-segment parts of a concatenated flat vector."""
    return tuple(flat[s.start : s.stop] for s in segments)


def to_device(parts) -> tuple:
    """Host parts as float64 device arrays (a transfer, nothing compiled)."""
    return tuple(jnp.asarray(np.asarray(p, np.float64)) for p in parts)


def lay_out(keys: Sequence[str], values: Sequence[np.ndarray], scale_leaves=None):
    """Concatenate the checked values (flat float64) into one point with a segment per key.

    Returns ``(segments, base, scale, parts)``: the segments, the flat point, the per-element
    scale for step sizes (computed per leaf of ``scale_leaves``, default ``values``), and the
    point split back into device arrays (the model's input).
    """
    segments, offset = [], 0
    for key, value in zip(keys, values, strict=True):
        segments.append(Segment(key, offset, int(value.size)))
        offset += int(value.size)
    base = np.concatenate(values) if len(values) else np.zeros((0,), np.float64)
    scale = element_scale(values if scale_leaves is None else scale_leaves)
    return segments, base, scale, to_device(split(base, segments))


def compute_gradients(model: Model, args, parts: tuple) -> dict:
    """``model.gradients`` as host arrays (concatenated), compiled when the model is traceable."""
    parts = to_device(parts)
    if model.traceable:
        grads = _gradients_jit(model, args, parts)
    else:
        grads = model.gradients(args, parts)
    order = sorted(grads, key=lambda k: (k != "backward", k))  # the code under test first
    return {k: np.asarray(grads[k], np.float64).ravel() for k in order if grads[k] is not None}


def check_gradients(
    model: Model,
    args,
    base: np.ndarray,
    scale: np.ndarray,
    cotangents: Sequence[jax.Array],
    segments: Sequence[Segment],
    *,
    seed: Sequence[int],
    gradients: dict | None = None,
) -> dict[str, GradientVerdict]:
    """Check every segment's gradient with finite differences (see the module docstring).

    Must run with float64 enabled (``jax.enable_x64(True)``). ``gradients`` (the result of
    `compute_gradients` at ``base``) may be passed when already computed.

    Returns:
      ``{segment name: GradientVerdict}``.
    """
    base = np.asarray(base, np.float64)
    tau = np.asarray(scale, np.float64)
    cotangents = [jnp.asarray(c, jnp.float64) for c in cotangents]
    if gradients is None:
        gradients = compute_gradients(model, args, split(base, segments))
    grads = gradients
    sources = list(grads)
    under_test = sources[0]
    seed = [int(v) for v in seed]
    evaluate = _Evaluator(model, args, cotangents, tau, segments)
    run = _Runner(evaluate, base, tau, grads, sources, segments, seed, model, args)

    results: dict[str, list[ProbeResult]] = {}
    for segment in segments:
        results[segment.name] = _first_probes(segment, grads, sources)
    run([p for probes in results.values() for p in probes])

    # Locate failures that no trusted autodiff reference can locate, element by element.
    extra = []
    for segment in segments:
        probes = results[segment.name]
        verdict = _verdict(segment, probes, grads, under_test, 0)
        if verdict.status == "Failed" and not verdict.reference_ok:
            more = _locating_probes(segment, probes, grads[under_test], seed)
            probes.extend(more)
            extra.extend(more)
    if extra:
        run(extra)
    return {
        s.name: _verdict(s, results[s.name], grads, under_test, run.moves.get(s.name, 0))
        for s in segments
    }


# -- choosing probes ------------------------------------------------------------------------------


def _first_probes(segment: Segment, grads: dict, sources: list[str]) -> list[ProbeResult]:
    if segment.size <= ONLY_COORDINATES_UP_TO:
        return [ProbeResult(segment.name, COORDINATE, i) for i in range(segment.size)]
    probes = [ProbeResult(segment.name, DIRECTION, d) for d in range(NUM_DIRECTIONS)]
    if "autodiff" in sources[1:]:
        g = grads[sources[0]][segment.start : segment.stop]
        r = grads["autodiff"][segment.start : segment.stop]
        gap = np.abs(g - r)
        gap = np.where(np.isnan(gap), np.inf, gap)
        threshold = _DISAGREEMENT * (np.max(np.abs(r), initial=0.0) + 1e-300)
        worst = [int(i) for i in np.argsort(-gap, kind="stable")[:NUM_WORST] if gap[i] > threshold]
        probes += [ProbeResult(segment.name, COORDINATE, i) for i in worst]
    return probes


def _locating_probes(segment, probes, under_test, seed) -> list[ProbeResult]:
    have = {p.index for p in probes if p.kind == COORDINATE}
    if segment.size <= ALL_COORDINATES_UP_TO:
        chosen = [i for i in range(segment.size) if i not in have]
    else:
        g = under_test[segment.start : segment.stop]
        magnitude = np.where(np.isnan(g), np.inf, np.abs(g))
        rng = np.random.default_rng([*seed, segment.start, 11])
        candidates = list(np.argsort(-magnitude, kind="stable")[: NUM_LOCATE // 2])
        candidates += list(rng.choice(segment.size, size=NUM_LOCATE, replace=False))
        chosen = []
        for i in candidates:
            if int(i) not in have and int(i) not in chosen:
                chosen.append(int(i))
        chosen = chosen[:NUM_LOCATE]
    return [ProbeResult(segment.name, COORDINATE, i) for i in chosen]


def _verdict(segment, probes, grads, under_test, moves) -> GradientVerdict:
    sliced = {k: v[segment.start : segment.stop] for k, v in grads.items()}
    resolved = [p for p in probes if p.resolved]
    if not resolved:
        status = "Incomplete"
    elif any(not p.passes(under_test) for p in resolved):
        status = "Failed"
    else:
        status = "Passed"
    return GradientVerdict(segment, status, under_test, sliced, probes, moves)


# -- running probes -------------------------------------------------------------------------------


class _Runner:
    """Evaluates probes, moving the sample point of unresolved ones (at most MAX_MOVES times)."""

    def __init__(self, evaluate, base, tau, grads, sources, segments, seed, model, args):
        self.evaluate, self.base, self.tau = evaluate, base, tau
        self.tau_host = np.asarray(tau)
        self.grads, self.sources = grads, sources
        self.segments = {s.name: s for s in segments}
        self.order = tuple(segments)
        self.seed, self.model, self.args = seed, model, args
        self.floors: dict[str, float] = {}
        self.moves: dict[str, int] = {}

    def __call__(self, probes) -> None:
        pending = list(probes)
        point, grad_stack = self.base, _stack(self.grads, self.sources)
        for attempt in range(MAX_MOVES + 1):
            raw = self._evaluate(pending, point, grad_stack, attempt)
            for name in {p.segment for p in pending} - set(self.floors):
                rows = [r for r, p in enumerate(pending) if p.segment == name]
                scale = _scales(raw[1][rows])
                self.floors[name] = FLOOR_FRACTION * float(np.max(scale, initial=0.0))
            for row, probe in enumerate(pending):
                tau_i = 1.0
                if probe.kind == COORDINATE:
                    tau_i = float(self.tau_host[self.segments[probe.segment].start + probe.index])
                _analyse(probe, [r[row] for r in raw], self.sources, self.floors, tau_i)
                probe.moves = attempt
            pending = [p for p in pending if not p.resolved]
            if not pending or attempt == MAX_MOVES:
                return
            # Move the sample point off the kink: jitter the segments that have pending probes.
            mask = np.zeros(self.base.shape, np.float64)
            for name in {p.segment for p in pending}:
                segment = self.segments[name]
                mask[segment.start : segment.stop] = 1.0
                self.moves[name] = self.moves.get(name, 0) + 1
            noise = np.random.default_rng([*self.seed, 1000 + attempt]).standard_normal(mask.size)
            point = self.base + MOVE_SIZE * self.tau * mask * noise
            try:
                moved = compute_gradients(self.model, self.args, split(point, self.order))
                grad_stack = _stack(moved, self.sources)
            except Exception:  # noqa: BLE001 - verdicts so far stand; the rest stay unresolved
                return

    def _evaluate(self, probes, point, grad_stack, attempt):
        """Raw sums for every probe: one compiled evaluation serves every segment."""
        support, signs = self._sparse(probes, attempt)
        raw = self.evaluate(jnp.asarray(point), jnp.asarray(grad_stack), support, signs)
        return tuple(np.asarray(r) for r in raw)

    def _sparse(self, probes, attempt):
        """(support, signs) per probe: the flat vector's elements it perturbs, and their signs.

        The width is fixed (shorter probes are padded with zero signs), so the compiled evaluator
        is reused whatever the mix of probes and segments.
        """
        width = max(min(s.size, DIRECTION_SUPPORT) for s in self.order)
        support = np.zeros((len(probes), width), np.int32)
        signs = np.zeros((len(probes), width), np.float64)
        for row, p in enumerate(probes):
            segment = self.segments[p.segment]
            if p.kind == COORDINATE:
                support[row, 0], signs[row, 0] = segment.start + p.index, 1.0
                continue
            count = min(segment.size, DIRECTION_SUPPORT)
            rng = np.random.default_rng([*self.seed, segment.start, p.index, attempt])
            support[row, :count] = segment.start + rng.choice(segment.size, count, replace=False)
            signs[row, :count] = rng.choice(np.array([-1.0, 1.0]), size=count)
        return support, signs


class _Evaluator:
    """Evaluates chunks of probes with one compiled function for all segments."""

    def __init__(self, model, args, cotangents, tau, segments):
        self.model, self.args, self.cotangents = model, args, cotangents
        self.tau = jnp.asarray(np.asarray(tau, np.float64))
        self.bounds = tuple((s.start, s.stop) for s in segments)
        out_elements = sum(int(np.prod(np.shape(c))) for c in cotangents)
        size = int(self.tau.size)
        per_probe = _EVALS_PER_PROBE * (out_elements + size) + 1
        self.chunk = int(min(_MAX_CHUNK, max(1, _CHUNK_ELEMENTS // per_probe)))

    def __call__(self, point, grads, support, signs):
        count, width = support.shape
        fixed = (self.model, self.bounds, self.args, self.cotangents, self.tau, point, grads)
        if not self.model.traceable:
            rows = [
                _probe_sums(*fixed, s, g)
                for s, g in zip(jnp.asarray(support), jnp.asarray(signs), strict=True)
            ]
            return tuple(np.stack([np.asarray(r[k]) for r in rows]) for k in range(4))
        chunk = self.chunk  # fixed, so one compilation serves every call
        padded = -(-count // chunk) * chunk
        support = np.concatenate([support, np.zeros((padded - count, width), np.int32)])
        signs = np.concatenate([signs, np.zeros((padded - count, width), np.float64)])
        outs = []
        for start in range(0, padded, chunk):
            part = _chunk_jit(*fixed, support[start : start + chunk], signs[start : start + chunk])
            outs.append(part)
        return tuple(np.concatenate([np.asarray(o[k]) for o in outs])[:count] for k in range(4))


def _probe_sums(model, bounds, args, cotangents, tau, point, grads, support, signs):
    """Loss changes of one probe at the seven points, their scales and noise, and ⟨g, τu⟩."""
    offsets = jnp.asarray([0.0] + [c for s in STEPS for c in (s, -s)], jnp.float64)
    step = signs * tau[support]
    w = jnp.zeros(point.shape, jnp.float64).at[support].add(step)
    values = point[None, :] + offsets[:, None] * w[None, :]

    def outputs(value):
        return model.outputs(args, tuple(value[start:stop] for start, stop in bounds))

    if model.traceable:
        ys = list(jax.vmap(outputs)(values))
    else:
        outs = [outputs(v) for v in values]
        ys = [jnp.stack(pieces) for pieces in zip(*outs, strict=True)]
    d = absd = noise = 0.0
    for y, c in zip(ys, cotangents, strict=True):
        y = jnp.asarray(y, jnp.float64)
        y0, rest, c = y[:1], y[1:], c[None]
        diff = rest - y0
        moved = jnp.where(diff != 0, jnp.abs(c) * (jnp.abs(rest) + jnp.abs(y0)), 0.0)
        # One variadic reduction: a single pass over memory for the three sums.
        sums = jax.lax.reduce(
            (c * diff, jnp.abs(c) * jnp.abs(diff), moved**2),
            (0.0, 0.0, 0.0),
            lambda a, b: (a[0] + b[0], a[1] + b[1], a[2] + b[2]),
            tuple(range(1, diff.ndim)),
        )
        d, absd, noise = d + sums[0], absd + sums[1], noise + sums[2]
    return d, absd, noise, grads[:, support] @ step


@functools.partial(jax.jit, static_argnames=("model", "bounds"))
def _chunk_jit(model, bounds, args, cotangents, tau, point, grads, support, signs):
    return jax.vmap(
        lambda s, g: _probe_sums(model, bounds, args, cotangents, tau, point, grads, s, g)
    )(support, signs)


@functools.partial(jax.jit, static_argnames=("model",))
def _gradients_jit(model, args, parts):
    return model.gradients(args, parts)


def _stack(grads: dict, sources: list[str]) -> np.ndarray:
    return np.stack([np.asarray(grads[s], np.float64) for s in sources])


def _scales(absd: np.ndarray) -> np.ndarray:
    """The absolute-sum scale R per probe and step (per unit step)."""
    steps = np.asarray(STEPS)
    return (absd[:, 0::2] + absd[:, 1::2]) / (2 * steps)


# -- analysis -------------------------------------------------------------------------------------


def _analyse(probe: ProbeResult, raw, sources, floors, tau_i: float) -> None:
    d, absd, noise, analytic = (np.asarray(r, np.float64) for r in raw)
    steps = np.asarray(STEPS)
    plus, minus = d[0::2], d[1::2]
    central = (plus - minus) / (2 * steps)
    one_sided_gap = (plus + minus) / steps  # (L(+) - L0)/s - (L0 - L(-))/s
    scale = (absd[0::2] + absd[1::2]) / (2 * steps)
    eps = np.finfo(np.float64).eps
    noise_floor = NOISE_FACTOR * eps * np.sqrt(noise[0::2] + noise[1::2]) / steps
    tol = RTOL * (scale + floors.get(probe.segment, 0.0)) + noise_floor
    probe.analytic = {s: float(a) for s, a in zip(sources, analytic, strict=True)}
    probe.scale = tau_i
    if not np.all(np.isfinite(central)):
        probe.resolved, probe.reason = False, "the function is not finite near the point"
        return

    def agree(a, b):
        return abs(central[a] - central[b]) <= tol[a] + tol[b]

    if agree(1, 2):
        chosen = 2
    elif agree(0, 1):
        chosen = 1
    else:
        probe.resolved, probe.reason = False, "finite differences disagree across step sizes"
        return
    gap, larger_gap = abs(one_sided_gap[chosen]), abs(one_sided_gap[chosen - 1])
    if gap > 2 * tol[chosen] and gap > 0.3 * larger_gap:
        probe.resolved, probe.reason = False, "one-sided differences disagree (a kink)"
        return
    probe.numerical = float(central[chosen])
    probe.tolerance = float(tol[chosen])
    probe.resolved, probe.reason = True, ""


# -- words ----------------------------------------------------------------------------------------


def describe_failure(verdict: GradientVerdict, locate) -> list[str]:
    """Lines saying how wrong the gradient is and where (``locate(i)`` names element ``i``)."""
    source = verdict.under_test
    got_all = verdict.gradients[source]
    lines = []
    if verdict.reference_ok:
        expected_all = verdict.gradients["autodiff"]
        lines += largest_errors(got_all, expected_all, range(got_all.size), locate)
        lines.append(
            "  expected values: JAX autodiff of the forward computation, which agrees with "
            "central finite differences at every probe"
        )
    else:
        coords = [p for p in verdict.resolved if p.kind == COORDINATE]
        if coords:
            got = np.array([p.analytic[source] / p.scale for p in coords])
            expected = np.array([p.numerical / p.scale for p in coords])
            lines += largest_errors(got, expected, [p.index for p in coords], locate)
            lines.append(
                f"  expected values: central finite differences in float64 at {len(coords)} of "
                f"{verdict.segment.size} elements"
            )
    directions = [p for p in verdict.resolved if p.kind == DIRECTION]
    if directions:
        worst = max(directions, key=lambda p: p.relative_error(source))
        support = min(verdict.segment.size, DIRECTION_SUPPORT)
        lines.append(
            f"  along {len(directions)} random directions ({support} elements each): largest "
            f"relative error {worst.relative_error(source):.3g} (directional derivative "
            f"{worst.analytic[source]:.6g}, numerical {worst.numerical:.6g})"
        )
    return lines


def describe_method(verdict: GradientVerdict) -> str:
    """One line: what was compared, and kinks avoided."""
    kinds = {COORDINATE: 0, DIRECTION: 0}
    for p in verdict.resolved:
        kinds[p.kind] += 1
    parts = []
    if kinds[DIRECTION]:
        parts.append(f"{kinds[DIRECTION]} random direction(s)")
    if kinds[COORDINATE]:
        parts.append(f"{kinds[COORDINATE]} single element(s)")
    text = (
        f"{' and '.join(parts) or 'no probe'}: central differences in float64 with relative "
        f"steps {', '.join(f'{s:g}' for s in STEPS)}"
    )
    if verdict.moves:
        text += f"; {verdict.moves} sample point move(s) to step off kinks"
    if verdict.unresolved:
        text += f"; {len(verdict.unresolved)} probe(s) left unresolved at kinks"
    return text


def largest_errors(got, expected, indices, locate) -> list[str]:
    """The largest absolute and relative errors, where (``locate(indices[k])``), got, expected."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    absolute = np.abs(got - expected)
    absolute = np.where(np.isnan(absolute), np.inf, absolute)
    relative = absolute / np.maximum(np.maximum(np.abs(expected), np.abs(got)), 1e-300)
    relative = np.where(absolute == 0, 0.0, relative)
    indices = list(indices)
    lines = []
    for label, errors in (("absolute", absolute), ("relative", relative)):
        k = int(np.argmax(errors))
        lines.append(
            f"  largest {label} error {errors[k]:.3g} at {locate(indices[k])}: got "
            f"{got[k]:.6g}, expected {expected[k]:.6g}"
        )
    return lines
