"""The serving benchmark: tokens delivered through the web path (websockets, the streaming API) against the bare
engine, on the embedded stack. `python -m bench.serving`; the measuring is in `clients.py`."""
