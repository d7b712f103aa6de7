"""One module per tool profile, each a table of its tools (spec and handler side by side);
``services/agents/tools.py`` names them and dispatches their calls."""
