"""Where replies leave: the outbox (exactly once), live previews and rendering."""
