"""trainnet's logits guard on the first batch (the check itself: ``_scoring.check_probabilities``).

With ``"crossentropy"`` (or ``"index-crossentropy"``), a network whose one output does not come
from a ``Softmax`` layer is run once on the first batch's inputs; logits there are a named error
before the first step, instead of a run whose loss falls while its accuracy stays at chance.
"""

from __future__ import annotations

from .._network import Network
from .._scoring import check_probabilities, loss_name, needs_probabilities
from ..layers import Softmax


def check_first_batch(who: str, net: Network, loss, loss_fn, source) -> None:
    """Raise ``OptionsError`` when a probability loss meets a network that gives logits."""
    if not needs_probabilities(loss_fn) or len(net.output_names) != 1:
        return
    (i, _), *_ = net.output_ports()
    if isinstance(net.layers[i], Softmax):
        return  # probabilities by construction: nothing to run
    check_probabilities(who, loss_name(loss), net.predict(*source.first_inputs()))
