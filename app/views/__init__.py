"""The main window's pages, one module each."""
