"""The request path, in the process that serves requests: from a shape and a prompt to the engine's
outputs and their verdict.

``runtime`` is the one path the CLI, the Python API and the HTTP app call: the budget check
(``budget.check``), the tokens a grammar forces taken as prompt (``jump_forward``), budget fitting
(``budget.fitting``), the reasoning parser's split (``reasoning``), the repetition guard placed per kind of
output (``repetition``, ``loop_sites``), and what the repeated-call guard watches and refused
(``refused_calls``); OpenAI's function calling and custom tools become shapes and messages here
(``tools``, ``custom_tools``), each in the model's tool-call format (``toolformats``: every
format by name, and the registries' part that calls into vLLM), and an answered call is decoded
again (``answered_calls``).

Separate from ``service/engine`` (once per engine, before the first request) and from
``service/vllm_core`` (inside vLLM's engine core): this package runs once per request. Two of its
parts run in the engine core too: ``repetition``'s detector, which budget fitting's mask consults,
and ``toolformats``, where the repeated-call guard resolves its format by name; neither imports
anything else of the service, so the engine core loads no more of this package.
"""
