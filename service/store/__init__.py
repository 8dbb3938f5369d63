"""What the HTTP layer keeps between requests: the stored responses of ``/v1/responses``."""
