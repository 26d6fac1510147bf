"""Make three variants of one small image classifier, in three formats, for ``failsoft zoo add``.

    python examples/byom/make_models.py /tmp/byom

writes, with random weights (seed 0) and nothing downloaded:

* ``hf/``: a ``transformers`` ResNet image classifier directory (config.json, model.safetensors and
  its image processor), 3 classes (cat, dog, bird), 32x32 RGB inputs;
* ``model.onnx``: the same model exported with ``torch.onnx.export`` (dynamic batch);
* ``model.pt2``: the same model exported with ``torch.export`` and saved with ``torch.export.save``;
* ``sample.npy``: four inputs to check and profile the variants on;
* ``eval.npz``: 32 inputs labelled by the ``hf`` model itself: measured on it, an export that answers
  as the original does scores 1.0 (random weights have no real accuracy to measure);
* ``train.npz``: 512 inputs (``x``) to train a ParM parity model of the family on
  (``failsoft parity train img/onnx --data``);
* ``cat.png``: a 48x40 PNG to send over HTTP as an encoded image.

docs/models.md walks through adding them and serving them with ``examples/byom/serve.yaml``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import AutoModelForImageClassification

from failsoft.zoo.formats import examples


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    hf_dir = examples.image_classifier(out / "hf", seed=0, side=32)
    examples.hf_image_exports(hf_dir, out / "model.onnx", out / "model.pt2", side=32)
    rng = np.random.default_rng(0)
    np.save(out / "sample.npy", rng.random((4, 3, 32, 32), dtype=np.float32))
    x = rng.random((32, 3, 32, 32), dtype=np.float32)
    model = AutoModelForImageClassification.from_pretrained(hf_dir, local_files_only=True).eval()
    with torch.no_grad():
        y = model(pixel_values=torch.from_numpy(x)).logits.argmax(1).numpy()
    np.savez(out / "eval.npz", x=x, y=y)
    np.savez(out / "train.npz", x=rng.random((512, 3, 32, 32), dtype=np.float32))
    pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out / "cat.png")
    print(
        f"wrote {hf_dir}, {out / 'model.onnx'}, {out / 'model.pt2'}, {out / 'sample.npy'}, "
        f"{out / 'eval.npz'}, {out / 'train.npz'}, {out / 'cat.png'}"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "byom-models"))
