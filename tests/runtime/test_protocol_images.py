"""Encoded images on the wire: an image classifier's app takes PNG and JPEG files as a BYTES input
(base64 in JSON, raw bytes in binary data), decoded with Pillow and prepared by the family's image
processor before any server sees them; a corrupt image is one 400 naming the element (no Ray here).
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from failsoft.errors import ConfigError, InvalidRequestError
from failsoft.runtime.gateway.protocol import ModelMeta, parse_infer_request
from failsoft.zoo.formats.images import ImageInput
from failsoft.zoo.formats.model import family_image_input

RNG = np.random.default_rng(3)
PIXELS = RNG.integers(0, 256, (2, 20, 24, 3), dtype=np.uint8)  # two 24x20 RGB images


def encoded(fmt: str = "PNG") -> list[bytes]:
    from PIL import Image

    out = []
    for array in PIXELS:
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


def json_request(elements: list, shape: list | None = None) -> bytes:
    tensor = {"name": "image", "shape": shape or [len(elements), 1], "datatype": "BYTES", "data": elements}
    return json.dumps({"inputs": [tensor]}).encode()


def binary_request(elements: list[bytes]) -> tuple[bytes, int]:
    raw = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    params = {"binary_data_size": len(raw)}
    tensor = {"name": "image", "shape": [len(elements)], "datatype": "BYTES", "parameters": params}
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + raw, len(header)


@pytest.fixture(scope="module")
def processor_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import ViTImageProcessor

    out = tmp_path_factory.mktemp("processor")
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(out)
    return str(out)


def expected_pixels(processor_dir: str, files: list[bytes]) -> np.ndarray:
    """What the model's own processor makes of the image files, in this process."""
    from PIL import Image
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(processor_dir, local_files_only=True)
    images = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
    return np.asarray(processor(images=images, return_tensors="np")["pixel_values"], np.float32)


def test_png_and_jpeg_in_json_and_binary_become_the_processors_pixels(processor_dir):
    meta = ModelMeta((3, 16, 16), 3, image=ImageInput(3, 16, 16, processor_dir))
    png = encoded("PNG")
    want = expected_pixels(processor_dir, png)
    as_b64 = [base64.b64encode(e).decode() for e in png]
    from_json = parse_infer_request(json_request(as_b64), "app", meta, 8).batch
    from_b64_objects = parse_infer_request(json_request([{"b64": s} for s in as_b64], [2]), "app", meta, 8)
    body, length = binary_request(png)
    from_binary = parse_infer_request(body, "app", meta, 8, length).batch
    assert from_json.dtype == np.float32 and from_json.shape == (2, 3, 16, 16)
    np.testing.assert_allclose(from_json, want, atol=1e-6)
    np.testing.assert_array_equal(from_b64_objects.batch, from_json)
    np.testing.assert_array_equal(from_binary, from_json)
    jpeg = encoded("JPEG")
    from_jpeg = parse_infer_request(json_request([base64.b64encode(e).decode() for e in jpeg]), "a", meta, 8)
    np.testing.assert_allclose(from_jpeg.batch, expected_pixels(processor_dir, jpeg), atol=1e-6)


def test_without_a_processor_images_are_resized_and_scaled_to_unit_range():
    meta = ModelMeta((1, 10, 12), 2, image=ImageInput(1, 10, 12))
    batch = parse_infer_request(json_request([base64.b64encode(e).decode() for e in encoded()]), "a", meta, 8)
    assert batch.batch.shape == (2, 1, 10, 12)
    assert batch.batch.min() >= 0.0 and batch.batch.max() <= 1.0


@pytest.mark.parametrize(
    ("elements", "shape", "says"),
    [
        (["bm90IGFuIGltYWdl"], [1, 1], "element 0 is not a PNG or JPEG image"),  # base64 of "not an image"
        (["%%%"], [1], "element 0 is not base64"),
        ([7], [1], "element 0 must be a base64 string"),
        (["aGk="], [1, 2], "take shape [N] or [N, 1]"),
        (["aGk=", "aGk="], [3], "2 images, shape [3] needs 3"),
        (["aGk="] * 9, [9], "batch size 9 is outside 1..8"),
    ],
)
def test_a_bad_image_request_is_refused_naming_what_is_wrong(elements, shape, says):
    meta = ModelMeta((3, 16, 16), 3, image=ImageInput(3, 16, 16))
    with pytest.raises(InvalidRequestError, match=r".*".join(map(_escaped, says.split(" ")))):
        parse_infer_request(json_request(elements, shape), "app", meta, 8)


def test_a_truncated_png_in_binary_data_names_its_element():
    meta = ModelMeta((3, 16, 16), 3, image=ImageInput(3, 16, 16))
    png = encoded()
    body, length = binary_request([png[0], png[1][: len(png[1]) // 2]])
    with pytest.raises(InvalidRequestError, match="'image': element 1 is not a PNG or JPEG image"):
        parse_infer_request(body, "app", meta, 8, length)


def test_an_app_without_images_refuses_bytes_naming_its_datatypes():
    meta = ModelMeta((3, 16, 16), 3)
    with pytest.raises(InvalidRequestError, match="datatype 'BYTES' is not supported"):
        parse_infer_request(json_request(["aGk="]), "app", meta, 8)


def test_a_family_whose_variants_prepare_images_differently_is_refused(processor_dir):
    same = family_image_input("img", {"hf": ImageInput(3, 16, 16, processor_dir), "onnx": None})
    assert same == ImageInput(3, 16, 16, processor_dir)
    with pytest.raises(ConfigError, match="family 'img': its variants prepare images differently"):
        family_image_input("img", {"hf": ImageInput(3, 16, 16, processor_dir), "pt2": ImageInput(3, 16, 16)})


def _escaped(word: str) -> str:
    import re

    return re.escape(word)


def test_metadata_says_the_pixel_input_also_takes_encoded_images():
    from failsoft.runtime.gateway.protocol import model_metadata

    meta = model_metadata("app", "img", ModelMeta((3, 16, 16), 3, image=ImageInput(3, 16, 16)), ["hf"])
    (pixels,) = meta["inputs"]
    assert pixels["shape"] == [-1, 3, 16, 16] and pixels["datatype"] == "FP32"
    assert pixels["parameters"]["encoded_images"]["formats"] == ["PNG", "JPEG"]
    plain = model_metadata("app", "img", ModelMeta((3, 16, 16), 3), ["hf"])
    assert "parameters" not in plain["inputs"][0]
