"""Collection: sessions, sinks, system info and the manifest."""
