"""The fleet: the same OpenAI app on several replicas under Ray Serve, and batch runs over them
with Ray Data (``tokenmold ray serve``, ``tokenmold ray batch``; docs/operations.md).

Ray is an extra (``tokenmold[ray]``): only the modules that need it import it, when they run.
"""
