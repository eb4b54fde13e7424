"""Networks built from one set of blocks: encoder-decoder, decoder-only LM, encoder classifier.

Models know attention only through the registry and depth only through the recurrence registry
(``stacked``; the Universal Transformer adds ``ut`` and ``ut_act``).
"""

from attnlab.models.blocks import LayerSpec
from attnlab.models.networks import DecoderLM, EncoderClassifier, EncoderDecoder
from attnlab.models.recurrence import available_recurrences, build_decoder_stack, build_encoder_stack

__all__ = [
    "DecoderLM",
    "EncoderClassifier",
    "EncoderDecoder",
    "LayerSpec",
    "available_recurrences",
    "build_decoder_stack",
    "build_encoder_stack",
]
