"""The guards: masks ANDed into the row llguidance fills, for what its grammar is built without.

Importing this package imports none of them.
"""
