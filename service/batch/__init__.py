"""Batch runs: OpenAI batch files through the same routes the HTTP server answers, one engine for
the whole file, results appended line by line so that a run can be killed and resumed."""
