"""``failsoft zoo add``: a user's model into the repository, checked, described and profiled.

What a Triton user does by hand (copy the model into the repository, write ``config.pbtxt``, run
Model Analyzer) is one step here, and nothing half-done is ever left behind:

1. the format is the one given, or read from the path (a directory with ``config.json``: ``hf``;
   ``.onnx``; ``.pt2``; ``.safetensors`` with ``--handler``: ``python``); pickle files are refused;
2. the artefact is copied into a hidden staging repository inside the root and loaded there by its
   format's handler (:mod:`failsoft.zoo.formats`), which declares its inputs and outputs;
3. it must answer the user's sample (``--sample``; seeded random values for a fixed-shape numeric
   input otherwise) at batch 1 and at the sample's batch, with the outputs it declared;
4. its inputs and outputs must match the family's other variants (a family's variants stand in for
   each other under failover: FailLite section 3);
5. its accuracy is ``--accuracy`` (*declared*) or measured on ``--eval`` labelled data (*measured*);
6. a stateful handler (one that defines ``state()`` and ``apply_state()``) must give its answers
   back when a state it gave is applied again (:func:`~failsoft.zoo.formats.stateful_handler.
   check_round_trip`), and is recorded ``stateful`` (a HAMS graph node may then serve it);
7. ``config.json`` (format, options, inputs, outputs, artefact hash) and ``sample.npy`` are written,
   the profiler measures it on the sample, and the variant is renamed into place.

Any refusal is one :class:`~failsoft.errors.FailsoftError` line and leaves the repository as it was.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from failsoft.errors import ConfigError, CorruptModelError, FailsoftError, ModelNotFoundError
from failsoft.zoo.formats.hf import check_directory, read_task
from failsoft.zoo.formats.images import PROCESSOR_FILE, image_input
from failsoft.zoo.formats.interface import NUMPY_DTYPES, Signature, TensorSpec, fields, records
from failsoft.zoo.formats.loader import load_handler_model
from failsoft.zoo.formats.model import SAMPLE_FILE, HandlerModel
from failsoft.zoo.formats.registry import ARTEFACTS, USER_FORMATS
from failsoft.zoo.formats.stateful_handler import StatefulHandlerModel, check_round_trip
from failsoft.zoo.layout import CONFIG_FILE, Accuracy, ModelFormat, VariantConfig, check_name, write_json
from failsoft.zoo.network import file_sha256
from failsoft.zoo.profiler import ProfileSettings, profile_variant
from failsoft.zoo.repository import ModelRepository
from failsoft.zoo.samples import read_eval, read_sample

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
SAMPLE_ROWS = 2  # rows of the random sample made when none is given


@dataclass(frozen=True)
class AddRequest:
    """One ``zoo add``: where the artefact is, what it is, and how its accuracy is known."""

    family: str
    variant: str
    path: Path
    model_format: str | None = None  # None: read from the path
    accuracy: float | None = None  # declared top-1 in [0, 1]
    eval_file: Path | None = None  # labelled data: accuracy measured
    sample_file: Path | None = None  # inputs to check and profile on
    handler: str | None = None  # python format: package.module:Class
    task: str | None = None  # hf format: overrides the config's task
    labels_file: Path | None = None  # one class name per line, class 0 first
    image_processor: Path | None = None  # a preprocessor_config.json (or its dir): takes encoded images

    def options(self, model_format: str) -> dict[str, Any]:
        if model_format == "python":
            if not self.handler:
                raise ConfigError("the python format needs --handler package.module:Class")
            return {"class": self.handler}
        if self.handler:
            raise ConfigError(f"--handler is for the python format, not {model_format}")
        if self.task is not None and model_format != "hf":
            raise ConfigError(f"--task is for the hf format, not {model_format}")
        return {"task": self.task} if self.task else {}


def detect_format(path: Path, given: str | None) -> ModelFormat:
    """The artefact's format: ``given`` (checked against the path), else read from the path."""
    if not path.exists():
        raise ModelNotFoundError(f"{str(path)!r} does not exist")
    if path.is_file() and path.suffix.lower() in PICKLE_SUFFIXES:
        raise CorruptModelError(
            f"{str(path)!r} is a pickle checkpoint, which failsoft never loads: "
            "export it (ONNX, torch.export) or save its weights as safetensors"
        )
    if given is not None:
        if given not in USER_FORMATS:
            raise ConfigError(f"unknown --format {given!r} (known: {', '.join(USER_FORMATS)})")
        if (given == "hf") != path.is_dir():
            raise ConfigError(
                f"format {given} takes a {'directory' if given == 'hf' else 'file'}: {str(path)!r}"
            )
        return cast(ModelFormat, given)
    if path.is_dir():
        if (path / "config.json").is_file():
            return "hf"
        raise ConfigError(f"{str(path)!r} is a directory without config.json: not a transformers directory")
    by_suffix: dict[str, ModelFormat] = {".onnx": "onnx", ".pt2": "pt2", ".safetensors": "python"}
    if path.suffix.lower() in by_suffix:
        return by_suffix[path.suffix.lower()]
    raise ConfigError(f"cannot tell the format of {str(path)!r}: give --format ({', '.join(USER_FORMATS)})")


def add_variant(
    repo: ModelRepository,
    request: AddRequest,
    settings: ProfileSettings | None = None,
    device: str | None = None,
) -> VariantConfig:
    """Check, write and profile one user's variant; on any error the repository is left as it was."""
    family, variant = check_name("family", request.family), check_name("variant", request.variant)
    model_format = detect_format(request.path, request.model_format)
    options = request.options(model_format)
    if repo.root.is_dir() and (repo.root / family / variant).exists():
        raise ConfigError(f"{family}/{variant} is already in {str(repo.root)!r}: remove it first")
    created_root = not repo.root.exists()
    repo.root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".add-", dir=repo.root))
    try:
        staged = staging / family / variant
        staged.mkdir(parents=True)
        config = _stage(repo, staged, request, model_format, options)
        profile_variant(ModelRepository(staging), family, variant, settings, device)
        (repo.root / family).mkdir(exist_ok=True)
        repo.safe_path(family)  # the family directory must not be a link out of the repository
        staged.rename(repo.root / family / variant)
    except BaseException:
        if created_root:
            shutil.rmtree(repo.root, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return config


def _stage(
    repo: ModelRepository,
    staged: Path,
    request: AddRequest,
    model_format: ModelFormat,
    options: dict[str, Any],
) -> VariantConfig:
    """Copy the artefact into ``staged``, load and check it, write its config.json and sample."""
    if model_format == "hf":  # before the copy, which leaves pickle files out
        check_directory(request.path, read_task(request.path, options.get("task")))
    artefact = staged / ARTEFACTS[model_format]
    _copy(request.path, artefact)
    size, sha = artefact_hash(artefact)
    draft = VariantConfig(
        request.family, request.variant, "user", {}, (1,), 1, 0, size, sha, Accuracy(0.0, "declared"),
        model_format=model_format, handler=options, weights_file=artefact.name,
    )  # fmt: skip
    with _named_as_given(artefact, request.path), load_handler_model(staged, draft, "cpu") as model:
        sample = read_sample(request.sample_file, model.signature) if request.sample_file else None
        sample = sample if sample is not None else _random_sample(model.signature.inputs)
        input_shape, num_classes = _check_answers(model, sample)
        stateful = isinstance(model, StatefulHandlerModel)
        if isinstance(model, StatefulHandlerModel):  # its state moves between copies (HAMS)
            check_round_trip(model, named(model, sample))
        signature = _pinned(model.signature, sample)
        _check_family(repo, request.family, signature)
        accuracy = _accuracy(model, request, sample)
        parameters = model.handler.parameters()
        labels = _labels(request.labels_file, num_classes) if request.labels_file else signature.labels
    if request.image_processor is not None:
        _keep_image_processor(request.image_processor, staged, model_format, signature)
    config = replace(
        draft, input_shape=input_shape, num_classes=num_classes, parameters=parameters, accuracy=accuracy,
        inputs=signature.inputs, outputs=signature.outputs, labels=labels, stateful=stateful,
    )  # fmt: skip
    write_json(staged / CONFIG_FILE, config.to_dict())
    np.save(
        staged / SAMPLE_FILE, sample.astype(bytes) if sample.dtype == object else sample, allow_pickle=False
    )
    return config


def _keep_image_processor(given: Path, staged: Path, model_format: str, signature: Signature) -> None:
    """Keep an image processor's config beside the variant, so that the gateway takes the model's
    images as PNG or JPEG and prepares them as the processor says (resize, rescale, normalise)."""
    source = given / PROCESSOR_FILE if given.is_dir() else given
    if model_format == "hf":
        raise ConfigError("--image-processor is for onnx, pt2 and python variants (an hf dir has its own)")
    if not source.is_file():
        raise ModelNotFoundError(f"{str(source)!r} does not exist (an image processor's {PROCESSOR_FILE})")
    first = signature.inputs[0]
    if first.datatype != "FP32" or image_input(first.shape, None) is None:
        raise ConfigError(f"--image-processor: the model's input {first.describe()} is no image [C, H, W]")
    shutil.copyfile(source, staged / PROCESSOR_FILE)
    decoder = image_input(first.shape, staged)
    assert decoder is not None
    probe = io.BytesIO()
    _probe_image(first.shape).save(probe, format="PNG")
    decoder.decode([probe.getvalue()])  # the processor loads and makes pixels of the model's shape


def _probe_image(shape: tuple[int, ...]) -> Any:
    from PIL import Image

    mode = "RGB" if shape[0] == 3 else "L"
    return Image.new(mode, (shape[2], shape[1]))


@contextmanager
def _named_as_given(staged: Path, given: Path) -> Iterator[None]:
    """Errors about the staged copy of the artefact name the path the user gave instead."""
    try:
        yield
    except FailsoftError as exc:
        message = str(exc).replace(str(staged), str(given))
        if message == str(exc):
            raise
        raise type(exc)(message) from exc


def _copy(source: Path, target: Path) -> None:
    """The artefact into the repository; a directory without its pickle files (never loaded), an
    ONNX model whose weights are in external files as one file (the names it refers to would not
    survive the copy)."""
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(*(f"*{s}" for s in PICKLE_SUFFIXES)))
    elif target.suffix == ".onnx":
        from failsoft.zoo.formats.onnx import copy_onnx

        copy_onnx(source, target)
    else:
        shutil.copyfile(source, target)


def artefact_hash(path: Path) -> tuple[int, str]:
    """(bytes, sha256) of a file; of a directory, the sha256 of its files' relative paths and hashes."""
    if path.is_file():
        return path.stat().st_size, file_sha256(path)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    manifest = "".join(f"{p.relative_to(path).as_posix()}\0{file_sha256(p)}\n" for p in files)
    return sum(p.stat().st_size for p in files), hashlib.sha256(manifest.encode()).hexdigest()


def _random_sample(specs: tuple[TensorSpec, ...]) -> np.ndarray:
    """Seeded values for fixed-shape numeric inputs (integers 0 and 1: token ids and masks that any
    vocabulary holds); one structured batch for several inputs."""
    rng = np.random.default_rng(0)
    batches = {}
    for spec in specs:
        if spec.datatype == "BYTES" or -1 in spec.shape:
            raise ConfigError(
                f"input {spec.describe()} needs a --sample of real inputs (.npy, .npz, .jsonl, .txt)"
            )
        shape = (SAMPLE_ROWS, *spec.shape)
        floating = spec.datatype.startswith(("FP", "BF"))
        values = rng.random(shape, dtype=np.float32) if floating else rng.integers(0, 2, shape)
        batches[spec.name] = values.astype(NUMPY_DTYPES[spec.datatype])
    return batches[specs[0].name] if len(specs) == 1 else records(batches, specs)


def named(model: HandlerModel, batch: np.ndarray) -> dict[str, np.ndarray]:
    """A batch as the model's named inputs: a structured batch's fields, else its first input."""
    return fields(batch) if batch.dtype.names else {model.signature.inputs[0].name: batch}


def _check_answers(model: HandlerModel, sample: np.ndarray) -> tuple[tuple[int, ...], int]:
    """The model answers the sample at batch 1 and at the sample's batch with what it declared;
    returns the served input shape and the number of classes (the first output's width)."""
    for spec, rows_of in named(model, sample).items():
        declared = next(t for t in model.signature.inputs if t.name == spec)
        if not declared.accepts(tuple(rows_of.shape[1:])):
            raise ConfigError(
                f"the sample's rows of {spec!r} have shape {list(rows_of.shape[1:])}, "
                f"the model takes {declared.describe()}"
            )
    for rows in sorted({1, len(sample)}):
        try:
            answers = model.infer(named(model, sample[:rows]))
        except FailsoftError:
            raise
        except Exception as exc:  # the user's model failing in its own library: name it, keep the cause
            raise ConfigError(
                f"the model fails on the sample at batch {rows}: {type(exc).__name__}: {exc}"
            ) from exc
        for out in model.signature.outputs:
            got = np.asarray(answers.get(out.name))
            if got.ndim == 0 or got.shape[0] != rows or not out.accepts(tuple(got.shape[1:])):
                raise ConfigError(
                    f"at batch {rows} output {out.name!r} has shape {list(got.shape)}, "
                    f"declared {out.describe()}"
                )
    first = model.signature.outputs[0]
    if len(first.shape) != 1 or first.shape[0] < 1 or first.datatype not in ("FP32", "FP16", "BF16", "FP64"):
        raise ConfigError(
            f"the first output {first.describe()} is not class scores (a float vector of fixed size)"
        )
    return tuple(int(d) for d in sample.shape[1:]), first.shape[0]


def _labels(path: Path, num_classes: int) -> tuple[str, ...]:
    """Class names from a labels file (one per line, Triton's ``labels.txt``), one per class."""
    try:
        labels = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read labels file {str(path)!r}: {exc}") from exc
    if len(labels) != num_classes:
        raise ConfigError(
            f"labels file {str(path)!r} names {len(labels)} classes; the model has {num_classes}"
        )
    return labels


def _pinned(signature: Signature, sample: np.ndarray) -> Signature:
    """The signature with its inputs' variable dimensions fixed to the sample's."""
    if sample.dtype.names is None:
        shapes = {signature.inputs[0].name: tuple(int(d) for d in sample.shape[1:])}
    else:
        shapes = {name: tuple(int(d) for d in sample.dtype[name].shape) for name in sample.dtype.names}
    pinned = tuple(TensorSpec(t.name, t.datatype, shapes.get(t.name, t.shape)) for t in signature.inputs)
    return Signature(pinned, signature.outputs, signature.labels)


def family_signature(config: VariantConfig) -> Signature:
    """What a variant takes and answers; a built-in variant one FP32 input and one logits output."""
    if config.inputs and config.outputs:
        return Signature(config.inputs, config.outputs)
    return Signature(
        (TensorSpec("input", "FP32", config.input_shape),),
        (TensorSpec("logits", "FP32", (config.num_classes,)),),
    )


def _check_family(repo: ModelRepository, family: str, signature: Signature) -> None:
    if not repo.root.is_dir():
        return
    for other in repo.variant_names(family):
        why = family_signature(repo.config(family, other)).mismatch(signature)
        if why is not None:
            raise ConfigError(f"does not match family {family!r} (variant {other!r}): {why}")


def _accuracy(model: HandlerModel, request: AddRequest, sample: np.ndarray) -> Accuracy:
    if (request.accuracy is None) == (request.eval_file is None):
        raise ConfigError("give the variant's accuracy: --accuracy A (declared) or --eval FILE (measured)")
    if request.accuracy is not None:
        if not 0.0 <= request.accuracy <= 1.0:
            raise ConfigError(f"--accuracy must be in [0, 1], got {request.accuracy}")
        return Accuracy(request.accuracy, "declared", {"source": "failsoft zoo add --accuracy"})
    assert request.eval_file is not None
    inputs, labels = read_eval(request.eval_file, model.signature)
    first_out = model.signature.outputs[0].name
    scores = [model.infer(named(model, inputs[i : i + 64]))[first_out] for i in range(0, len(inputs), 64)]
    predicted = np.concatenate(scores).argmax(axis=1)
    value = float((predicted == labels).mean())
    detail = {
        "eval_file": request.eval_file.name,
        "eval_sha256": file_sha256(request.eval_file),
        "examples": len(labels),
    }
    return Accuracy(value, "measured", detail)
