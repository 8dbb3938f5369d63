"""What runs inside vLLM's engine core process: tokenmold's patches to vLLM and what they chain to
its grammars.

vLLM loads the plugin (``vllm_plugin.register``, the ``vllm.general_plugins`` entry point) in
every process it starts, but what the patches install works in the engine core, where vLLM builds
its structured-output backend and fills the bitmasks: the grammar chain beside each grammar
(``grammar_chain``, ``repeated_calls``), llguidance's matchers built from a prototype
(``llguidance_prototypes``), the grammar store in front of xgrammar's compiler
(``xgrammar_store``) and the forced-token proposer (``forced_drafts``, which vLLM loads by its
class path from the speculative config). What each patch assumes of vLLM is ``vllm_contract``.

Kept apart from the serving process's packages (``engine``, ``request``, ``validation``, ``api``,
``cli``): the engine core loads none of them but two modules of ``service/request`` that import
nothing else of the service (the repetition guard's detector, the tool-call formats by name), and
the HTTP app loads none of this; the import contracts in pyproject.toml (``lint-imports``) check
both directions. The serving process reaches in at two points only, both named there: it checks
and installs the patches in its own process first (a vLLM mismatch is then one line, before
anything is spawned), and it writes the grammar store's settings under the key the engine core
reads (``xgrammar_store``).
"""
