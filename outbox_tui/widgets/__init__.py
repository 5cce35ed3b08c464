"""The console's widgets: header, overview, dispatchers, event table and detail."""
