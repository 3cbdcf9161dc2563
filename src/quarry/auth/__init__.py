"""Who may call a device, and over what: tokens with roles, and TLS (docs/security.md)."""

from quarry.auth.middleware import NAME, REQUIRED, TokenCheck, authorize, bearer

__all__ = ["NAME", "REQUIRED", "TokenCheck", "authorize", "bearer"]
