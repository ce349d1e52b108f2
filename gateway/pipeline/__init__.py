"""The message pipeline: intake, dedupe, access, routing, commands and per-session lanes."""
