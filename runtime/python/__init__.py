"""Python analysis in a sandbox: ``run_python`` and ``/py`` (docs/python.md).

Modules: `sandbox` (bubblewrap, the warm pool, the checked result), `runner` (the script that
runs inside; nothing of Pluto), `tool` (the tool and the command's text).
"""
