"""The application: command, query, forget, search and context services, their ranking and ports."""
