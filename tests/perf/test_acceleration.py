"""hardware speed options (training/acceleration.py) on configs that predate them."""

from __future__ import annotations

from omegaconf import OmegaConf

from attnlab.training.acceleration import OPTIONS, switch
from attnlab.training.config import HardwareSchema


def test_an_absent_speed_option_resolves_as_the_schema_default_does():
    """A saved config from before the options (``training/evaluation.py`` builds the module from it, no schema merged)
    must get what a new config gets: activation checkpointing was turned on on a GPU for such configs."""
    old = OmegaConf.create({"hardware": {"accelerator": "gpu", "precision": "bf16-mixed"}})
    new = OmegaConf.create({"hardware": {"accelerator": "gpu", "precision": "bf16-mixed",
                                         **{n: HardwareSchema.__dataclass_fields__[n].default for n in OPTIONS}}})
    assert {n: switch(old, n) for n in OPTIONS} == {n: switch(new, n) for n in OPTIONS}
