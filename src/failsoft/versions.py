"""Model versions: Triton's numbered version directories, as variant names failsoft routes by.

A model repository may hold numbered versions of a variant (``<family>/<variant>/<N>/``, Triton's
layout); a variant without numbered directories is version 1, as it always was. To the rest of
failsoft every version is a variant of its family of its own, named ``<variant>@<N>`` (version 1
keeps the plain name), so that it is planned, loaded and routed like any variant, and a rolling
update to a new version is a deploy that moves the app to another variant
(:mod:`failsoft.orchestration.deploy`). ``@`` never appears in a variant's own name (names are
letters, digits, ``_``, ``-`` and ``.``), so the two never collide.
"""

from __future__ import annotations

from failsoft.errors import ModelNotFoundError

VERSION_MARK = "@"


def versioned(variant: str, version: int) -> str:
    """The name a version of ``variant`` goes by: ``variant`` for version 1, ``variant@N`` after.

    Triton's repository layout numbers a model's versions (``<family>/<variant>/<N>/``); a variant
    without numbered directories is version 1, as it always was. Every version is a variant of its
    family of its own to the rest of failsoft (planned, loaded, routed by that name), so a rolling
    update to a new version is a deploy that moves the app to another variant.
    """
    return variant if version == 1 else f"{variant}{VERSION_MARK}{version}"


def split_version(name: str) -> tuple[str, int | None]:
    """``("mlp_l", 2)`` for ``mlp_l@2``; ``(name, None)`` for a name without a version."""
    if not isinstance(name, str):  # refused by the caller's name check, which says why
        return name, None
    base, mark, number = name.partition(VERSION_MARK)
    if not mark:
        return name, None
    if not number.isascii() or not number.isdigit() or int(number) < 1:
        raise ModelNotFoundError(f"invalid version in {name!r}: versions are whole numbers from 1")
    return base, int(number)


def version_of(variant: str) -> int:
    """The version a variant name stands for (1 without a mark)."""
    return split_version(variant)[1] or 1
