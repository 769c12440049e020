"""The job console: a browser page under ``/ui`` that is a view of the ``/v1`` API.

The page holds no server-side state and has no privileges of its own: it calls the same API with the
key its user signs in with. Its assets are plain files in ``static/`` (ES modules, CSS, SVG), served
by :mod:`app.api.console.routes`; nothing is built and nothing is fetched from elsewhere.
"""
