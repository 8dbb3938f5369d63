"""Validated partial streaming: each member and element of a streamed JSON answer, judged against
the schema that applies where it sits, the moment it closes (``partials``), and the option to end a
generation at its first invalid part (``stop_on_invalid``). Scanner, locator, judge and the stream
wrapper live in a module each."""
