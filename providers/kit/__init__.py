"""The provider kit: what chat providers share, as small named functions.

A provider translates between one platform and the gateway; most of that is the platform's own.
What is the same everywhere lives here, so that a new provider is mostly its platform:

- :mod:`.files` — files users send (caps on size, safe names, a streamed download that stops at
  the limit, the sentences a person is told) and files a reply carries (read off the loop);
- :mod:`.notices` — a quiet notice to a chat (why a file was refused) that never raises;
- :mod:`.loops` — a poll/reconnect loop with exponential backoff, and following a run's feed;
- :mod:`.errors` — HTTP statuses, ``Retry-After`` and transport failures as typed
  :class:`~pluto.errors.ProviderError`\\ s;
- :mod:`.signatures` — webhook signatures (HMAC-SHA256 of the raw body) and shared secrets,
  compared in constant time; timestamps checked for staleness;
- :mod:`.markup` — the parts markup emitters share (HTML escaping, code-block languages,
  ``<a href>`` links that keep only safe targets);
- :mod:`.settings` — settings fields and checks (environment variable names, URLs, webhook
  paths, "needs the HTTP server");
- :mod:`.payload` — reading a platform's JSON defensively (a string, a dict, a list at a key);
- :mod:`.http` — a request body read no further than a limit;
- :mod:`.buttons` — buttons under a message (an approval's Approve / Deny) and a click as the
  message it stands for, checked privately first.

See ``docs/provider-kit.md`` for an example of a provider built on it.
"""
