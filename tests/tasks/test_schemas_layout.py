"""Every built-in task schema declares the model it trains, so the config check builds its attention roles."""

from attnlab.tasks.schemas import _SCHEMAS
from attnlab.training.config import LAYOUT_ROLES


def test_every_built_in_schema_declares_a_model_layout():
    undeclared = sorted(loader for loader, schema in _SCHEMAS.items() if schema.model_layout not in LAYOUT_ROLES)
    assert not undeclared, f"schemas without model_layout (their attention is never checked): {undeclared}"


def test_layouts_of_the_families_that_differ_from_their_parent_schema():
    assert _SCHEMAS["text_lm"].model_layout == "decoder" and _SCHEMAS["lambada"].model_layout == "decoder"
    assert _SCHEMAS["masked_lm"].model_layout == "encoder"  # subclasses the text LM's schema, trains an encoder
    assert _SCHEMAS["translation"].model_layout == "encoder_decoder"
    assert _SCHEMAS["summarization"].model_layout == "encoder_decoder"  # via Seq2SeqTextCommon
