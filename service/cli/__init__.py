"""The ``tokenmold`` command line, in the process it starts: ``generate``, ``serve``, ``batch``,
``extract`` and ``bench`` parse their flags here (``main``) and then run the engine, the HTTP app
or a benchmark in this same process.

A package of its own so that ``python -m tokenmold.service.cli`` (``__main__``) runs the very
module the ``tokenmold`` entry point runs, imported once under its own name; and apart from the
engine and request packages, which it starts but which never import it.
"""
