"""trainnet in a real Jupyter kernel (IPython's, run by nbclient; neither is ours).

The progress bar must be rich's live widget there (rich needs ipywidgets), the live plot a PNG
in the cell's output, replaced at each redraw, and nothing may end in an error output. The
widget's last text is read from the widget state that nbclient stores in the notebook.
"""

from __future__ import annotations

import base64
import json
import re

import pytest

nbclient = pytest.importorskip("nbclient")  # a test extra: `pip install -e '.[test]'`
nbformat = pytest.importorskip("nbformat")

CELL = """
import numpy as np
import difffn as df
from difffn import layers as L

rng = np.random.default_rng(0)
X = rng.standard_normal((64, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")
options = df.TrainingOptions(
    max_epochs=2, mini_batch_size=16, verbose=True, metrics="accuracy",
    plots="training-progress", plots_path="progress.png",
)
net = df.trainnet(X, Y, [L.FeatureInput(4), L.FullyConnected(2), L.Softmax()],
                  "crossentropy", options)
"""


@pytest.mark.slow
def test_training_in_a_jupyter_kernel_shows_the_live_bar_and_the_live_plot(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    client = nbclient.NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
        store_widget_state=True,
    )
    client.execute(env={"DIFFFN_COMPILATION_CACHE": "off", "JAX_PLATFORMS": "cpu"})
    outputs = notebook.cells[0].outputs
    assert not [o for o in outputs if o.output_type == "error"], outputs

    # the bar: rich's live output inside an ipywidgets Output widget, with rate and time left
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    state = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    texts = [
        item.get("data", {}).get("text/plain", "")
        for model in state.values()
        if model["model_name"] == "OutputModel"
        for item in model["state"].get("outputs", [])
    ]
    bar = re.compile(
        r"8/8.*epoch 2/2, [\d.]+ it/s, \d\d:\d\d:\d\d left, loss \d+\.\d+, "
        r"Accuracy \d+\.\d+, learn rate 0\.01"
    )
    assert any(bar.search(text) for text in texts), json.dumps(texts)[:2000]

    # the live plot: one PNG in the cell's output (replaced in place at each redraw), the same
    # picture as the file on disk at the end
    pictures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pictures) == 1, [list(o.get("data", {})) for o in outputs]
    shown = base64.b64decode(pictures[0]["data"]["image/png"])
    assert shown.startswith(b"\x89PNG\r\n\x1a\n")
    assert shown == (tmp_path / "progress.png").read_bytes()

    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Training stopped: Max epochs completed" in text
