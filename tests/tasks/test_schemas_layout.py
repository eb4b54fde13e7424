"""Every built-in task schema declares the model it trains, so the config check builds its attention roles."""

from attnlab.tasks.schemas import TASK_SCHEMAS, task_schema
from attnlab.training.config import LAYOUT_ROLES


def test_every_built_in_schema_declares_a_model_layout():
    undeclared = [loader for loader in TASK_SCHEMAS.names() if task_schema(loader).model_layout not in LAYOUT_ROLES]
    assert not undeclared, f"schemas without model_layout (their attention is never checked): {undeclared}"


def test_layouts_of_the_families_that_differ_from_their_parent_schema():
    assert task_schema("text_lm").model_layout == "decoder" and task_schema("lambada").model_layout == "decoder"
    assert task_schema("masked_lm").model_layout == "encoder"  # subclasses the text LM's schema, trains an encoder
    assert task_schema("translation").model_layout == "encoder_decoder"
    assert task_schema("summarization").model_layout == "encoder_decoder"  # via Seq2SeqTextCommon
