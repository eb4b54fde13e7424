"""The built-in task families: importing this module imports each one, which registers it.

Imported by ``build_task`` when a task is built, not by the package: the families bring their libraries
(sacrebleu, rouge, datasets: about two seconds), which ``from attnlab.tasks import TaskData`` should not pay.
"""

from attnlab.tasks import (  # noqa: F401  (each import registers its family)
    algorithmic,
    babi,
    dialogue,
    glue,
    lambada,
    listops,
    lra_bytes,
    lte,
    masked_lm,
    probes,
    span_corruption,
    summarization,
    sva,
    text_lm,
    text_to_text,
    translation,
    translation_mixture,
)
