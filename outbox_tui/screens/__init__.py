"""The console's screens: the main view and its modal dialogs (confirm, filter, help)."""
