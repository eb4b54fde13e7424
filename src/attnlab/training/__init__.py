"""Training floor: Lightning modules per task family, callbacks, schedules, config checks and ``run``.

Import what you need from its submodule (``attnlab.training.run``, ``attnlab.training.config``, ...): the package
itself loads nothing, so a light submodule (``training.scale``, ``training.config``) imports without torch and
Lightning.
"""
