"""What the tests share: the live servers and the early work (``servers.py``, ``early.py``), the
shared server's flags and shapes (``live_api.py``), the suite's unprivileged user
(``any_user.py``), hypothesis strategies and paths; none of it is part of the installed package."""
