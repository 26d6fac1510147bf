"""Small models in every format, with random weights and fixed seeds, for the docs, examples and tests.

Nothing here is downloaded: the image classifier is a two-stage ResNet built from a ``transformers``
config, the text classifier a one-layer BERT over a word-level tokenizer trained here with the
``tokenizers`` library, and the MLP a plain ``torch.nn.Sequential``. Each is written the way a user
would write theirs (``save_pretrained``, ``torch.onnx.export``, ``torch.export.save``, safetensors),
so ``failsoft zoo add`` is exercised on the same artefacts users bring.

:class:`MlpHandler` is a ``python``-format handler (``failsoft.zoo.formats.examples:MlpHandler``): the
shape of a user's own handler class. :class:`OnlineKMeans` is a *stateful* one (it defines
``state()`` and ``apply_state()``): an online learner whose centroids move with every request, which
a HAMS graph node serves with a primary and a backup (docs/hams.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.zoo.formats.interface import Handler, Signature, TensorSpec
from failsoft.zoo.formats.python import load_arrays, load_safetensors

if TYPE_CHECKING:
    import torch

IMAGE_LABELS = ("cat", "dog", "bird")
TEXTS = ("a good film", "a bad film", "good acting and a good story", "bad acting and a dull story")
MLP_SIZES = (8, 16, 3)  # inputs, hidden, classes
KMEANS_SIZES = (4, 8)  # features, clusters (an OnlineKMeans's scores feed the MLP in the docs' graph)


def image_classifier(out: Path, seed: int = 0, side: int = 32, width: int = 8) -> Path:
    """A ``transformers`` ResNet image classifier directory (config, safetensors, image processor)."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification, ViTImageProcessor

    torch.manual_seed(seed)
    labels = dict(enumerate(IMAGE_LABELS))
    config = ResNetConfig(  # type: ignore[call-arg]
        embedding_size=width,
        hidden_sizes=[width, 2 * width],
        depths=[1, 1],
        num_labels=len(labels),
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    model = ResNetForImageClassification(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    ViTImageProcessor(size={"height": side, "width": side}).save_pretrained(out)
    return out


def _logits_module(model: Any, input_name: str) -> torch.nn.Module:
    """A ``transformers`` classifier whose one input is ``x`` and whose one output is its logits
    (what ONNX and torch.export take)."""
    import torch

    class _Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(**{input_name: x}).logits

    return _Logits().eval()


def hf_image_exports(hf_dir: Path, onnx_path: Path, pt2_path: Path, side: int = 32) -> None:
    """The same image classifier as an ONNX file and a ``torch.export`` program (batch dynamic)."""
    import torch
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(
        hf_dir, local_files_only=True, use_safetensors=True
    )
    module = _logits_module(model.eval(), "pixel_values")
    x = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(0))
    export_onnx(module, x, onnx_path, "pixel_values")
    export_pt2(module, x, pt2_path)


def export_onnx(module: torch.nn.Module, example: torch.Tensor, path: Path, input_name: str) -> None:
    """``torch.onnx.export`` with a dynamic batch dimension, weights inside the one file.

    The TorchScript-based exporter (``dynamo=False``) takes a fraction of a second on these models
    where the newer one takes several; its warnings (deprecated; a traced shape check that is a
    constant for these models) are silenced here."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        _export_onnx(module, example, path, input_name)


def _export_onnx(module: torch.nn.Module, example: torch.Tensor, path: Path, input_name: str) -> None:
    import torch

    torch.onnx.export(
        module,
        (example,),
        str(path),
        input_names=[input_name],
        output_names=["logits"],
        dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
    )


def export_pt2(module: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    """``torch.export`` with a dynamic batch dimension, saved with ``torch.export.save``."""
    import torch

    batch = torch.export.Dim("batch", max=4096)
    program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))


def text_classifier(out: Path, seed: int = 0, texts: Sequence[str] = TEXTS) -> Path:
    """A one-layer BERT sequence classifier with a word-level tokenizer trained on ``texts``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(list(texts), trainers.WordLevelTrainer(special_tokens=specials))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )
    torch.manual_seed(seed)
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    BertForSequenceClassification(config).eval().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def mlp_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """The MLP's weights (``w1``, ``b1``, ``w2``, ``b2``), seeded."""
    rng = np.random.default_rng(seed)
    n_in, hidden, n_out = MLP_SIZES
    return {
        "w1": rng.normal(0, 0.5, (hidden, n_in)).astype(np.float32),
        "b1": rng.normal(0, 0.1, hidden).astype(np.float32),
        "w2": rng.normal(0, 0.5, (n_out, hidden)).astype(np.float32),
        "b2": rng.normal(0, 0.1, n_out).astype(np.float32),
    }


def mlp_module(weights: Mapping[str, np.ndarray]) -> torch.nn.Module:
    """The MLP as torch layers holding ``weights``; its one input is named ``x``."""
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            n_in, hidden, n_out = MLP_SIZES
            self.hidden, self.out = torch.nn.Linear(n_in, hidden), torch.nn.Linear(hidden, n_out)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.relu(self.hidden(x)))

    net = Mlp()
    with torch.no_grad():
        for layer, w, b in ((net.hidden, "w1", "b1"), (net.out, "w2", "b2")):
            layer.weight.copy_(torch.from_numpy(weights[w]))
            layer.bias.copy_(torch.from_numpy(weights[b]))
    return net.eval()


def mlp_artefacts(out: Path, seed: int = 0) -> dict[str, Path]:
    """The MLP in three formats: ``onnx``, ``pt2`` and ``python`` (safetensors for :class:`MlpHandler`)."""
    import torch
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = mlp_weights(seed)
    module = mlp_module(weights)
    example = torch.zeros(2, MLP_SIZES[0])
    paths = {"onnx": out / "mlp.onnx", "pt2": out / "mlp.pt2", "python": out / "mlp.safetensors"}
    export_onnx(module, example, paths["onnx"], "x")
    export_pt2(module, example, paths["pt2"])
    save_file(dict(weights), str(paths["python"]))
    return paths


class MlpHandler(Handler):
    """A ``python``-format handler: the MLP in torch code of its own, its weights from safetensors."""

    _weights: dict[str, Any] | None = None
    _device = "cpu"

    def load(self, device: str) -> Signature:
        self._weights = load_safetensors(self.artefact, device)
        self._device = device
        n_in, _, n_out = MLP_SIZES
        return Signature((TensorSpec("x", "FP32", (n_in,)),), (TensorSpec("logits", "FP32", (n_out,)),))

    def preprocess(self, inputs: Mapping[str, np.ndarray]) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(inputs["x"], dtype=np.float32)).to(self._device)

    def predict(self, batch: Any) -> Any:
        import torch

        assert self._weights is not None, "MlpHandler.predict before load"
        w = self._weights
        with torch.inference_mode():
            hidden = torch.relu(batch @ w["w1"].T + w["b1"])
            return hidden @ w["w2"].T + w["b2"]

    def postprocess(self, raw: Any) -> dict[str, np.ndarray]:
        return {"logits": raw.cpu().numpy()}

    def parameters(self) -> int:
        return sum(t.numel() for t in (self._weights or {}).values())

    def close(self) -> None:
        self._weights = None


TOKENS = (8, 16, 4, 3)  # sequence length, vocabulary, embedding width, classes


def token_module(seed: int = 0) -> torch.nn.Module:
    """A bag-of-embeddings text classifier of two inputs (``input_ids``, ``attention_mask``, INT64
    ``[8]``) and two outputs (``logits`` ``[3]`` and the pooled embedding ``[4]``): the shape of a
    tokenized model exported on its own, without its tokenizer."""
    import torch

    _, vocab, width, classes = TOKENS

    class Tokens(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, classes)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            mask = attention_mask.unsqueeze(-1).float()
            pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return self.head(pooled), pooled

    torch.manual_seed(seed)
    return Tokens().eval()


def token_inputs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded token ids and masks (each row keeps at least its first token)."""
    seq, vocab, _, _ = TOKENS
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, seq)) < 0.7).astype(np.int64)
    mask[:, 0] = 1
    return {"input_ids": rng.integers(0, vocab, (rows, seq)), "attention_mask": mask}


def token_artefacts(out: Path, seed: int = 0) -> dict[str, Path]:
    """The two-input model as ``onnx`` and ``pt2``, and ``sample.npz`` (one array per input)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    module = token_module(seed)
    example = {k: torch.from_numpy(v) for k, v in token_inputs(2, seed).items()}
    args = (example["input_ids"], example["attention_mask"])
    paths = {"onnx": out / "tokens.onnx", "pt2": out / "tokens.pt2", "sample": out / "sample.npz"}
    batch = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module,
            args,
            str(paths["onnx"]),
            input_names=["input_ids", "attention_mask"],
            output_names=["logits", "pooled"],
            dynamic_axes={"input_ids": batch, "attention_mask": batch, "logits": batch, "pooled": batch},
            dynamo=False,
        )
    dim = torch.export.Dim("batch", max=4096)
    program = torch.export.export(module, args, dynamic_shapes=({0: dim}, {0: dim}))
    torch.export.save(program, str(paths["pt2"]))
    sample = token_inputs(4, seed + 1)
    np.savez(paths["sample"], input_ids=sample["input_ids"], attention_mask=sample["attention_mask"])
    return paths


def kmeans_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """:class:`OnlineKMeans`'s initial state: ``centroids`` (clusters x features, float32, seeded)
    and ``counts`` (int64, one point each: the prior weight of the initial centroids)."""
    features, clusters = KMEANS_SIZES
    rng = np.random.default_rng(seed)
    return {
        "centroids": rng.normal(0, 1, (clusters, features)).astype(np.float32),
        "counts": np.ones(clusters, dtype=np.int64),
    }


def kmeans_artefact(out: Path, seed: int = 0) -> Path:
    """:class:`OnlineKMeans`'s weights as ``out`` (a ``.safetensors`` file)."""
    from safetensors.numpy import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(kmeans_weights(seed), str(out))
    return out


class OnlineKMeans(Handler):
    """A stateful ``python``-format handler: sequential k-means (MacQueen's online update).

    A request is one point (``x``, FP32 ``[features]``); the answer is its score for each cluster,
    the negative squared distance to the cluster's centroid (the nearest scores highest), computed
    *before* the point moves: then the nearest centroid ``c`` takes one step toward it,
    ``c += (x - c) / n``, where ``n`` counts the points it has taken (the initial ones included).
    The centroids and the counts are the state (``state()`` / ``apply_state()``); the weights file
    holds their initial values. Plain numpy, float32, one point at a time: on CPU a copy given the
    same state answers bit-equal.
    """

    _centroids: np.ndarray
    _counts: np.ndarray

    def load(self, device: str) -> Signature:
        self.apply_state(load_arrays(self.artefact))  # numpy code: the weights stay on the CPU
        clusters, features = self._centroids.shape
        return Signature(
            (TensorSpec("x", "FP32", (features,)),), (TensorSpec("scores", "FP32", (clusters,)),)
        )

    def preprocess(self, inputs: Mapping[str, np.ndarray]) -> Any:
        return np.asarray(inputs["x"], dtype=np.float32)

    def predict(self, batch: Any) -> Any:
        scores = np.empty((len(batch), len(self._centroids)), dtype=np.float32)
        for i, x in enumerate(batch):  # in order: each point moves a centroid before the next
            d2 = ((self._centroids - x) ** 2).sum(axis=1)
            scores[i] = -d2
            j = int(np.argmin(d2))
            self._counts[j] += 1
            self._centroids[j] += (x - self._centroids[j]) / np.float32(self._counts[j])
        return scores

    def postprocess(self, raw: Any) -> dict[str, np.ndarray]:
        return {"scores": raw}

    def parameters(self) -> int:
        return int(self._centroids.size)

    def state(self) -> dict[str, np.ndarray]:
        return {"centroids": self._centroids, "counts": self._counts}  # the wrapper copies them

    def apply_state(self, state: Mapping[str, np.ndarray]) -> None:
        self._centroids = np.array(state["centroids"], dtype=np.float32)
        self._counts = np.array(state["counts"], dtype=np.int64)
