"""Networks built from one set of blocks: encoder-decoder, decoder-only LM, encoder classifier,
encoder with a masked-LM head.

Models know attention only through the registry and depth only through the recurrence registry
(``stacked``; the Universal Transformer adds ``ut`` and ``ut_act``).
"""

from attnlab.models import stacked, universal  # noqa: F401  (each import registers its recurrences)
from attnlab.models.blocks import LayerSpec
from attnlab.models.networks import DecoderLM, EncoderClassifier, EncoderDecoder, EncoderMLM
from attnlab.models.recurrence import available_recurrences, build_decoder_stack, build_encoder_stack

__all__ = [
    "DecoderLM",
    "EncoderClassifier",
    "EncoderDecoder",
    "EncoderMLM",
    "LayerSpec",
    "available_recurrences",
    "build_decoder_stack",
    "build_encoder_stack",
]
