"""The model arguments lm-eval hands the adapter, from ``--model_args`` and from its own flags:
an unknown or a repeated one is one line naming it, before any model loads."""

from __future__ import annotations

import pytest

from implicitlm.core.errors import OptionError
from implicitlm.eval.harness import ImplicitLMHarness
from implicitlm.models import ModelLoadError

# What lm-eval's command line adds to every --model_args (its --batch_size default, --device).
ADDED = {"batch_size": 1, "max_batch_size": None, "device": "cpu"}


@pytest.mark.parametrize("model_args, expected", [
    ("pretrained=nowhere,bogus=1", "unknown model argument 'bogus'"),  # before: TypeError
    ("pretrained=nowhere,max_iters=4", "did you mean 'max_iter'?"),
    ("pretrained=nowhere,batch_size=0", "model argument 'batch_size' given twice"),  # before: TypeError
    ("pretrained=nowhere,device=", "model argument 'device' given twice"),  # before: TypeError
])
def test_an_unknown_or_repeated_model_argument_is_one_line_naming_it(model_args, expected):
    for create in (lambda: ImplicitLMHarness.create_from_arg_string(model_args, ADDED),
                   lambda: ImplicitLMHarness.create_from_arg_obj(dict(item.split("=") for item in model_args.split(",")),
                                                                 ADDED)):
        with pytest.raises(OptionError) as raised:
            create()
        assert "\n" not in str(raised.value) and expected in str(raised.value), raised.value


def test_a_model_argument_lm_eval_does_not_add_reaches_the_adapter():
    """The arguments pass on as before: here, to load_model, which names the missing checkpoint."""
    with pytest.raises(ModelLoadError, match="nowhere: does not exist"):
        ImplicitLMHarness.create_from_arg_string("pretrained=nowhere,device=cpu", {"batch_size": 2})
