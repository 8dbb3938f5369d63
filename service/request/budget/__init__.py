"""A request's output budget on the request path (the grammar layer's ``tokenmold.grammar.budget``
holds the logic): the check that refuses a budget below the shape's shortest output before any
token is generated (``check``), and budget fitting's request side (``fitting``): the spec line the
engine's mask reads and the replay that gives the verdict its ``fitted`` and ``cut``.
"""
