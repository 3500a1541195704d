"""Adapters that let other agent frameworks keep their memory in memcli.

Each lives in its own module and imports its framework at the top: import the module only when that
framework is installed (e.g. `pip install memcli[llama-index]`). Nothing in memcli imports them.
"""
