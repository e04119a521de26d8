"""The families' table is the one place a family is described: the help's names and default,
the architectures ``--model`` takes, the models built and the package's exports all read it."""

from __future__ import annotations

import dataclasses

import implicitlm.models as models
from implicitlm.models import families
from implicitlm.models.families import BY_ARCHITECTURE, FAMILIES
from implicitlm.models.loading import config_from_options, model_option_names, model_options_help

# A family as one more row: Mamba2's classes under another architecture name.
TINY = dataclasses.replace(BY_ARCHITECTURE["mamba2"], architecture="tiny")


def help_line() -> str:
    return model_options_help().splitlines()[0]


def test_the_help_names_the_shipped_families_the_first_as_default():
    assert help_line() == "model options (--model KEY=VALUE; architecture=mamba2 (default), llama or mamba picks the family):"
    assert type(config_from_options({})) is FAMILIES[0].config_class


def test_a_family_added_as_one_row_is_named_in_the_help_and_taken_by_architecture(monkeypatch):
    """Before: the help named mamba2, llama and mamba in a sentence of its own, whatever the table held."""
    monkeypatch.setattr(families, "FAMILIES", (*FAMILIES, TINY))
    monkeypatch.setitem(BY_ARCHITECTURE, "tiny", TINY)
    assert help_line().endswith("architecture=mamba2 (default), llama, mamba or tiny picks the family):")
    options = dict(architecture="tiny", vocab_size=12, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8)
    assert type(config_from_options(options)) is TINY.config_class
    assert model_option_names("tiny") == model_option_names("mamba2")


def test_the_first_row_is_the_one_the_help_calls_the_default(monkeypatch):
    monkeypatch.setattr(families, "FAMILIES", (BY_ARCHITECTURE["llama"], BY_ARCHITECTURE["mamba"]))
    assert help_line().endswith("architecture=llama (default) or mamba picks the family):")
    monkeypatch.setattr(families, "FAMILIES", (BY_ARCHITECTURE["mamba"],))
    assert help_line().endswith("architecture=mamba (default) picks the family):")


def test_the_package_exports_every_familys_classes_by_name():
    for family in FAMILIES:
        for cls in (family.config_class, family.model_class):
            assert getattr(models, cls.__name__) is cls and cls.__name__ in models.__all__
    assert len(models.FAMILY_CLASSES) == 2 * len(FAMILIES)
