"""The admin console: accounts and roles, sign-in (local and OpenID Connect), CSRF, API keys per
role, the audit log, and the pages under ``/console`` (docs/console.md)."""
