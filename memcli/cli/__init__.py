"""The command-line tool: a thin layer over the library."""
