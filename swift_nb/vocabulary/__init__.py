"""The toggles' vocabulary: what each toggle is called, how it is written, its parameters.

A package: the entries' schema (``schema``), the entries themselves (``entries``) and the
spec grammar (``grammar``); everything is named here. One entry per toggle (``TOGGLES``), torch-free, read by everything that names a toggle:
the magic's flags and help, ``--compare`` variants, ``--forecast`` and ``swift_nb.forecast``
specs, the forecast form, the rerun launcher, the findings. Implementations live in
``swift_nb/toggles/<id>.py`` (``Entry.implementation``, imported only when a toggle is
built); an entry without one is understood by the forecast only (``zero``).

The one grammar of a toggle spec:

- a toggle: ``galore``, ``galore(rank=64,gap=200)`` or ``galore:rank=64,gap=200``;
- a list: toggles separated by commas; a ``key=value`` after a ``:`` spec continues it
  (``flash_attention,galore:rank=64,gap=200`` is two toggles);
- a variant (``--compare``): toggles joined by ``+`` (``grad_checkpointing+galore(rank=64)``);
  variants are a list of those.

Parameter values are converted and checked by their ``Param``; names or aliases (``gap``)
both work.
"""

from swift_nb.vocabulary.entries import (
    TOGGLES,
    clashes,
    entry,
    flag_of,
    flagged,
    needs_cuda,
    param_flag,
    register,
    runnable_ids,
    unregister,
)
from swift_nb.vocabulary.grammar import (
    parse_item,
    parse_list,
    parse_params,
    parse_variants,
    spec_text,
    split_list,
)
from swift_nb.vocabulary.schema import (
    ACTS_ON,
    Entry,
    Param,
    StepCost,
    at_least,
    between,
    between_float,
    positive,
    valid_regex,
)

__all__ = [
    "ACTS_ON",
    "TOGGLES",
    "Entry",
    "Param",
    "StepCost",
    "at_least",
    "between",
    "between_float",
    "clashes",
    "entry",
    "flag_of",
    "flagged",
    "needs_cuda",
    "param_flag",
    "parse_item",
    "parse_list",
    "parse_params",
    "parse_variants",
    "positive",
    "register",
    "runnable_ids",
    "spec_text",
    "split_list",
    "unregister",
    "valid_regex",
]
