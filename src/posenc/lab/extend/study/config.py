"""The settings of ``posenc extend``, kept importable here for ``posenc.cli``: they live in ``settings.config``."""

from posenc.lab.extend.settings.config import ExtendConfig as ExtendConfig
