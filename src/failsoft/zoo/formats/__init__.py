"""Model formats: the libraries failsoft loads a user's model with, behind one handler contract.

:mod:`~failsoft.zoo.formats.interface` is the contract (load, preprocess, predict, postprocess, and
an optional state pair); :mod:`~failsoft.zoo.formats.registry` picks a handler by format name
(``onnx``, ``pt2``, ``hf``, ``python``); :mod:`~failsoft.zoo.formats.model` wraps a loaded handler as
the :class:`~failsoft.zoo.loaded.LoadedModel` the runtime serves. The zoo's own architectures are the
``builtin`` format and load as they always have (:mod:`failsoft.zoo.network`).

Every format reads its artefact with the library made for it; none unpickles, none downloads.
"""
