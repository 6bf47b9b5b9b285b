"""The lengths ``posenc extend`` reads, kept importable here for ``posenc.cli``: they live in ``settings.lengths``."""

from posenc.lab.extend.settings.lengths import LENGTH_FORMS as LENGTH_FORMS
from posenc.lab.extend.settings.lengths import length_form as length_form
