"""The guards: masks ANDed into the row llguidance fills, for what its grammar is built without.

One module per constraint held (``string_length``, ``item_count``, ``unanchored_pattern``,
``anchored_pattern``, ``string_format``, ``unique_keys``), the modules they share
(``automaton``, ``held_patterns``, ``vocabulary_runs``), which keywords the grammar leaves to them
(``held_keywords``) and the guard that runs them on one output (``schema_guard``). Importing this
package imports none of them.
"""
