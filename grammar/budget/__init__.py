"""Output budgets, the one home of everything a ``max_tokens`` means to a shape.

``floor``: the shortest output a JSON Schema allows, in tokens of one vocabulary (a budget below it
is refused before any token is generated). The rest is budget fitting (``budget: "fit"``): the
fitter that keeps an answer within its budget as it is generated (``fitter``, ``tracker``,
``schema``, ``patterns``, ``numbers``, ``string_content``), which keywords it can plan for
(``coverage``), and the replay that tells what the budget did to an output (``replay``).
"""
