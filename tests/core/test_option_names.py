"""The name tables known without torch match the classes that check the values."""

from implicitlm.core.option_names import MODEL_OPTIONS, TRAINING_SETTINGS
from implicitlm.core.schema import field_names
from implicitlm.models.families import BY_ARCHITECTURE
from implicitlm.models.loading import model_option_names
from implicitlm.train.config import TrainConfig


def test_the_training_setting_names_are_the_training_configs_fields():
    assert TRAINING_SETTINGS == tuple(field_names(TrainConfig))


def test_the_model_option_names_are_every_familys_options():
    every_family = {name for architecture in BY_ARCHITECTURE for name in model_option_names(architecture)}
    assert sorted(MODEL_OPTIONS) == sorted(every_family) and len(set(MODEL_OPTIONS)) == len(MODEL_OPTIONS)
